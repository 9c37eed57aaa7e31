"""isoprobe entry point: `python run.py model=chronos data=energy` (see README.md)."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    from isoprobe.tasks import exit_on_user_error, run_task

    with exit_on_user_error():
        run_task(cfg)


if __name__ == "__main__":
    main()
