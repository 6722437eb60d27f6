"""The wallet: GPU prices across AWS, GCP and Azure, cost policies, migration decisions and
preemption notices (thesis ch. 6, "Exploiting Dynamic Pricing").

``cloud`` stands alone: it imports nothing of ``orchestrator`` or ``actors`` and reports every
failure a user can fix as :class:`cloud.errors.CloudError` (one line naming cloud, call and
reason), which the orchestrator CLI prints like its own errors. Checkpoint transfer lives with the
checkpoint format in ``actors``.

Nothing is imported here eagerly - importing ``cloud`` pulls no SDK and does no I/O. Entry points:
``cloud.sources.get_source``, ``cloud.store.PriceStore``, ``cloud.importers.load_any``,
``cloud.throughput.ThroughputTable``, ``cloud.policies``, ``cloud.migration.plan_migration``,
``cloud.replay.replay``, ``cloud.preemption.watcher_for``, ``cloud.cli.add_parsers``.
"""
