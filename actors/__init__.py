"""actors package: the Ray stage workers that execute the schedule IR.

Public pieces: :class:`~actors.group.WorkerGroup` (the Ray actors of a job),
:class:`~actors.stage_worker.StageWorker` / :class:`~actors.job_spec.JobSpec` (one worker),
:mod:`actors.checkpoint` (block-keyed checkpoints), :class:`~actors.reference.ReferenceTrainer`
(the single-process exactness oracle). Submodules import torch and Ray, so nothing is imported
eagerly here.
"""
