"""`slime-hydra [overrides]` or `python -m slime_hydra [overrides]`: compose the config with
Hydra and run the job."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from slime_hydra import app
from slime_hydra.config import register_configs

register_configs()


def conf_dir() -> str:
    """The configs: slime_hydra/conf inside an installed wheel (setup.py ships the top-level conf/
    there), else the checkout's conf/ (a checkout or an editable install). An absolute path: the
    console script imports this module by name, where Hydra would read a relative config_path as
    a package."""
    package = Path(__file__).resolve().parent
    shipped = package / "conf"
    return str(shipped if shipped.is_dir() else package.parent / "conf")


CONF_DIR = conf_dir()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Hydra's entry point; the work is in slime_hydra.app. The return value is the objective
    a sweeper (e.g. optuna) minimises."""
    return app.main(cfg)


if __name__ == "__main__":
    main()
