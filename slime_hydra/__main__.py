"""`slime-hydra [overrides]` or `python -m slime_hydra [overrides]`: compose the config with
Hydra and run the job."""

import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from slime_hydra import app, sweep
from slime_hydra.config import register_configs
from slime_hydra.errors import Stopped, raise_stopped, stop_signal

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
def hydra_main(cfg: DictConfig) -> float | None:
    """Hydra's entry point; the work is in slime_hydra.app. The return value is the objective
    a sweeper (e.g. optuna) minimises."""
    return app.main(cfg)


def main() -> None:
    """`slime-hydra` and `python -m slime_hydra`: Hydra's entry point, where SIGINT or SIGTERM
    outside a job (Hydra composing the config, or setting a sweep's next job up) is one line and
    exit 130/143 instead of a traceback, and a sweep that stops before its end (a signal, a job
    killed, an error in Hydra's launcher) still ends with its line."""
    signal.signal(signal.SIGTERM, raise_stopped)
    try:
        hydra_main()
        code: int | str | None = 0
    except (KeyboardInterrupt, Stopped) as exc:
        signum = stop_signal(exc)
        name = signal.Signals(signum).name
        print(f"stopped by {name} outside any job (Hydra was setting one up).", file=sys.stderr)
        code = 128 + signum
    except SystemExit as exc:
        code = exc.code
    if code:
        signals = {130: "SIGINT", 143: "SIGTERM"}
        why = signals.get(code, f"exit status {code}, after the error above")
        line = sweep.stopped_line(why)
        if line is not None:
            print(line, flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
