"""The job layer: :class:`~orchestrator.elastic.job_loop.ElasticJob`, its configs and the policies and watchers it
runs between iterations (evacuation, drains, node watchers, spot prices), and how a job is launched and observed."""
