"""isoprobe entry point: `python run.py model=chronos data=energy` (see README.md)."""

import warnings

import hydra
from omegaconf import DictConfig

# configs/hydra/launcher/submitit_{slurm,local}.yaml are named as hydra-submitit-launcher's own
# schemas on purpose, so that Hydra checks their keys against them; Hydra warns that it does
warnings.filterwarnings(
    "ignore", message=".*validated against ConfigStore schema with the same name"
)


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Run the task. A job of a multirun goes on where an earlier run of its sweep stopped, and
    its failure does not stop the sweep (isoprobe/tasks/sweep_job.py). With ``objective=<metric>``
    (such as ``test/wql``) it returns that metric of the run's test forecast, which a search
    sweeper (``hydra/sweeper=search``, Optuna) optimises."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from isoprobe.tasks import exit_on_user_error, run_task
    from isoprobe.tasks.sweep_job import objective_value, run_sweep_job

    with exit_on_user_error():
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            results = run_sweep_job(cfg, run_task)
        else:
            results = run_task(cfg)
        return objective_value(results, cfg.objective) if cfg.get("objective") else None


if __name__ == "__main__":
    main()
