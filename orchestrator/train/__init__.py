"""The driver side of the runtime: :class:`~orchestrator.train.runtime.PipelineRuntime` runs a plan on the stage
actors of :mod:`actors` and offers step primitives (submit, complete, move live, restart, recover) to the layers
above; the cluster discovery it places actors with."""
