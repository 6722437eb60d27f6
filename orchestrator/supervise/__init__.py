"""The supervisor outside the training cluster (the top layer: it may import everything below,
nothing but the CLI imports it): :class:`~orchestrator.supervise.supervisor.Supervisor` with its
:class:`~orchestrator.supervise.supervisor.SupervisorConfig`, the provisioners behind
:class:`~orchestrator.supervise.provision.Provisioner` (``local``, ``existing``, ``ray-up``), its
state and the run's merged event log (:mod:`~orchestrator.supervise.state`), and the CLI glue
(``orchestrator run``, ``orchestrator events``). As a Python object::

    from orchestrator.supervise.local import LocalProvisioner
    from orchestrator.supervise.offers import local_offers
    from orchestrator.supervise.supervisor import Supervisor, SupervisorConfig

    config = SupervisorConfig(driver=("examples/elastic_gpt.py", "--steps", "24"), storage="s3://ckpt/run",
                              offers=tuple(local_offers(2, 4)))
    Supervisor(config, LocalProvisioner(cpus=4)).run()
"""
