"""Running fedcache methods on Flower (flwr): per-client shards (``shard``), one generic ServerApp
(``server``) and ClientApp (``client``) for every registered method, Flower's simulation engine
(``sim``) and loopback deployments of real SuperLink / SuperNode processes (``local``). See
docs/deploy.md. Nothing is imported here: ``shard`` works without flwr; the rest needs the
``flower`` extra."""
