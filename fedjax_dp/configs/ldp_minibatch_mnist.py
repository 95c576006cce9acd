"""Local mini-batch gradient DP with per-client thresholds (the patent) on embedded MNIST.

Seed 003 (local mini-batch gradient DP patent) on the embedded MNIST subset: every local step draws
16 of the client's examples, clips each example's gradient to C = 1 and adds the client's own noise;
per-client thresholds epsilon_n = 4 (delta 1e-5), correlation-weighted aggregation, the global model
validated on 1 % of the training examples held out of every client. The patent's CNN; gamma 0.05
(the patent's 0.01 needs many more rounds)."""

from fedjax_dp.training.default_config import default_config


def get_config():
    c = default_config()
    c.algorithm = "ldp_minibatch"
    c.model.name = "cnn_fedavg"
    c.rounds, c.eval_every = 30, 5
    c.data.partition = "iid"
    c.client.update(batch_size=16, learning_rate=0.05)
    c.server_data.overlap = 0.0
    c.ldp.update(
        thresholds="4.0",
        local_steps=10,
        clip_norm=1.0,
        noise_multiplier=0.8,
        max_noise_multiplier=10.0,
    )
    return c
