"""Requeue on preemption through Lightning when submitit started the job on SLURM.

The two disagree on the signal out of the box. submitit's sbatch script asks SLURM for
``SIGUSR2`` ``signal_delay_s`` seconds before it stops a job (submitit moved off ``SIGUSR1``,
which NCCL may catch; ``SUBMITIT_PREEMPT_SIGNAL`` changes it) and installs its own handler for
it, which would resubmit the job from its start. Lightning's ``SLURMEnvironment`` requeues on
``SIGUSR1`` by default, and does not replace a handler that is already installed. Left so, the
signal reaches submitit alone and the run starts again from nothing.

:func:`slurm_plugins` settles it: Lightning's SLURM environment listens to submitit's signal,
and submitit's handler for it is removed before the trainer is built, so that Lightning's runs:
it saves ``hpc_ckpt_<n>.ckpt`` in the run directory and requeues the job (``scontrol
requeue``), and the requeued job resumes from that checkpoint
(:func:`isoprobe.tasks.sweep_job.newest_checkpoint`).
"""

from __future__ import annotations

import os
import signal

from lightning.pytorch.plugins.environments import SLURMEnvironment

#: the variable through which submitit names its preemption signal (default ``USR2``)
SUBMITIT_SIGNAL_VARIABLE = "SUBMITIT_PREEMPT_SIGNAL"


def submitit_signal() -> signal.Signals:
    """The signal submitit's sbatch script has SLURM send before it stops the job."""
    return signal.Signals["SIG" + os.environ.get(SUBMITIT_SIGNAL_VARIABLE, "USR2")]


def slurm_plugins() -> list[SLURMEnvironment]:
    """The trainer's SLURM environment, requeueing on submitit's signal, when this process is
    a SLURM task that submitit started (and nothing otherwise)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or not SLURMEnvironment.detect():
        return []
    requeue = submitit_signal()
    signal.signal(requeue, signal.SIG_DFL)
    return [SLURMEnvironment(auto_requeue=True, requeue_signal=requeue)]
