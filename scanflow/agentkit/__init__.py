"""What an agent process needs around the SDK, on every platform (one machine, compose, Kubernetes).

`env`: the workflow and the agent's own spec, its peers and the service URLs, from the environment the
process was started with. `outbox`: durable, ordered delivery of events to peers. `observe` and
`latency`: what the Checker reads from the Prometheus texts of gateways and replicas. `detectors`: the
Checker's detector options from its AgentSpec. The SDK (`scanflow.agent`) knows none of this;
`scanflow.embedded` is only the single-machine stack that starts these processes.
"""
