"""The wallet: GPU prices across AWS, GCP and Azure, cost policies, migration decisions,
preemption notices (thesis ch. 6, "Exploiting Dynamic Pricing").

Nothing is imported here eagerly - importing ``cloud`` pulls no SDK and does no I/O. Entry points:
``cloud.sources.get_source``, ``cloud.store.PriceStore``, ``cloud.importers.load_any``,
``cloud.throughput.ThroughputTable``, ``cloud.policies``, ``cloud.migration.plan_migration``,
``cloud.replay.replay``, ``cloud.preemption.watcher_for``,
``cloud.cli.add_parsers``.
"""
