"""The algorithm protocol: what every federated algorithm provides to the generic round.

In the spirit of fedjax's ``FederatedAlgorithm`` (init / apply over dataclass state) and
pfl-research's hooks, an algorithm is a small frozen object with four pure functions:

* ``init(params, key) -> ServerState``;
* ``broadcast(state) -> shared``: what every sampled client receives (the global model, the round
  index for learning-rate decay, SCAFFOLD's server control variate...);
* ``client_update(shared, client, client_state, key) -> ClientOut``: one client's work, run by the
  cohort engine under vmap / scan; ``client_state`` is that client's stored state (SCAFFOLD's c_i)
  or None;
* ``server_update(state, aggregate, key) -> (ServerState, metrics)``: applies the round's aggregate.

Uploads follow one sign convention: the direction the server adds (FedAvg's Delta w^k = w^k - w_t;
UGA's -g^k), so the mean of the uploads is applied through the server optimizer as the
pseudo-gradient ``-mean`` (Reddi et al. 2021). Weighting, the non-finite drop, upload transforms
(clipping, noise, compression) and the round's metrics belong to ``core.round``, written once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_dp.core import tree


@flax.struct.dataclass
class ServerState:
    """Global parameters, server optimizer state, rounds applied, the algorithm's own server-side
    state (``extra``: SCAFFOLD's control variate c) and the upload transforms' state (``uploads``:
    the adaptive clip norm, the compression reference)."""

    params: Any
    opt_state: Any
    round: jax.Array
    extra: Any = None
    uploads: Any = None


class ClientOut(NamedTuple):
    """What ``client_update`` returns for one client."""

    upload: Any  # a pytree in the direction the server adds (Delta w^k, or -g^k)
    weight: jax.Array  # aggregation weight: n_k for example-weighted means, 1 for uniform ones
    client_state: Any  # the client's new state (None for stateless algorithms)
    loss: jax.Array  # the client's training loss (reported, never used by the server step)
    ok: jax.Array  # upload, state and loss are finite: a client that is not is dropped
    # where ``loss`` is an objective with a regulariser (FedProx's proximal term, SCAFFOLD's
    # correction,
    # PFLDyn's R(w)): its data term alone, reported beside it as ``train_data_loss``; None elsewhere
    data_loss: Any = None


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What an algorithm needs from the data side and the loop.

    Attributes:
      server_set: a server-held set (FedMeta's D_meta).
      client_state: per-client state kept between rounds (``client_state_init`` gives the
        initial one).
      evaluation_pass: cohorts also carry each client's whole data once (UGA's gradient evaluation),
        in batches of ``evaluation_batch_size`` (0: the client batch size).
      sampled_steps: > 0: cohorts hold that many local steps, each a batch of B drawn without
        replacement from the client's data independently of the others
        (``data.packing.pack_sampled_cohort``: the sampling example-level DP accounting assumes); 0:
        shuffled epochs.
      personalized: the algorithm defines ``personalized_correct(state, client_state, train,
        test) -> (n_test,)``: 1.0 per test example that the client's own model (built from the
        global state, its stored state and its padded training data ``{x, y, mask}``) labels
        correctly (PFLDyn's prototypes, a fine-tune). It is traced: evaluation maps it over every
        client in one compiled pass and reports the mean and the distribution over clients.
      batches_per_step: with ``sampled_steps``, each step draws this many batches of B at once,
        without replacement (PFLDyn's two disjoint batches D, D' are one draw of 2B, split in
        halves).
      global_classifier: the global model's output is class scores (central test accuracy is
        reported); False for a representation (PFLDyn's meta-model), scored only through
        ``personalized_correct``.
      poisson_batch_cap: > 0: with ``sampled_steps``, each step is a Poisson batch instead (each
        example with probability B / n_k; ``data.packing.pack_poisson_cohort``) padded to this many
        slots.
      step_noise: local steps draw DP-SGD noise from each client's noise key
        (``client["noise_key"]``, its one consumer: ``core.rng``), so the upload chain may not draw
        from it too.
      per_example_gradients: local steps take each example's gradient (DP-SGD's clipping): on a CPU
        ``auto`` then runs conv models' steps in a scan with im2col convolutions
        (``core.strategy``), where a vmapped XLA convolution's per-example weight gradient is the
        slow part.
    """

    server_set: bool = False
    client_state: bool = False
    evaluation_pass: bool = False
    evaluation_batch_size: int = 0
    personalized: bool = False
    sampled_steps: int = 0
    batches_per_step: int = 1
    global_classifier: bool = True
    poisson_batch_cap: int = 0
    per_example_gradients: bool = False
    step_noise: bool = False


@flax.struct.dataclass
class Aggregate:
    """The cohort's uploads after the server side of the upload transforms.

    ``sum`` is the (possibly noised, reconstructed) sum of the weighted uploads and ``denominator``
    what it is divided by: the total weight of the kept clients, or a fixed D (DP-FedAvg's m or qK).
    ``kept`` counts the clients whose uploads entered the sum; ``fixed`` says the denominator does
    not depend on them (then even a round without kept clients is applied: its noise is the
    release).
    """

    sum: Any
    denominator: jax.Array
    kept: jax.Array
    fixed: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def mean(self):
        return jax.tree_util.tree_map(lambda s: s / self.denominator, self.sum)

    @property
    def applies(self) -> jax.Array:
        """Whether a server step should follow (a data-dependent mean of nothing is skipped)."""
        return jnp.asarray(True) if self.fixed else self.kept > 0


class Algorithm(Protocol):
    requirements: Requirements

    def init(self, params, key: jax.Array | None = None) -> ServerState: ...

    def broadcast(self, state: ServerState) -> Any: ...

    def client_update(self, shared, client, client_state, key: jax.Array) -> ClientOut: ...

    def server_update(
        self, state: ServerState, aggregate: Aggregate, key: jax.Array
    ) -> tuple[ServerState, dict]: ...

    def upload_template(self, params) -> Any: ...

    # Optional, where ``requirements.personalized``:
    # def personalized_correct(self, state: ServerState, client_state, train: dict, test: dict) ->
    # jax.Array
    # def evaluation_state(self, state: ServerState, client_states) -> ServerState  # the state
    # personalised
    #     evaluation starts from, given every client's stacked state (default: ``state``)


def init_server_state(
    params, server_optimizer: optax.GradientTransformation, extra=None
) -> ServerState:
    return ServerState(
        params=params,
        opt_state=server_optimizer.init(params),
        round=jnp.zeros((), jnp.int32),
        extra=extra,
    )


def apply_server_gradient(
    state: ServerState,
    gradient,
    server_optimizer: optax.GradientTransformation,
    update_scale=None,
) -> ServerState:
    """One server-optimizer step on an aggregated pseudo-gradient; the round counter advances.
    ``update_scale`` multiplies the optimizer's update: for SGD, momentum and Adam exactly a factor
    on the server learning rate (``hypergrad`` adapts it); None leaves the update as it is."""
    updates, opt_state = server_optimizer.update(gradient, state.opt_state, state.params)
    if update_scale is not None:
        updates = jax.tree_util.tree_map(lambda u: u * update_scale, updates)
    return state.replace(
        params=optax.apply_updates(state.params, updates),
        opt_state=opt_state,
        round=state.round + 1,
    )


def apply_mean_upload(
    state: ServerState,
    mean_upload,
    applies,
    server_optimizer: optax.GradientTransformation,
    update_scale=None,
):
    """``-mean_upload`` as the server's pseudo-gradient (FedOpt; plain SGD at rate 1 gives
    w_{t+1} = w_t + mean Delta w). Where ``applies`` is False the parameters and optimizer state
    stay and only the round counter advances. ``update_scale``: ``apply_server_gradient``'s."""
    stepped = apply_server_gradient(
        state, jax.tree_util.tree_map(jnp.negative, mean_upload), server_optimizer, update_scale
    )
    return stepped.replace(
        params=tree.where(applies, stepped.params, state.params),
        opt_state=tree.where(applies, stepped.opt_state, state.opt_state),
    )


def lr_scale(decay: float, round_index: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Client learning-rate factor ``decay ** t`` in round t (seed 002 decays 0.992 per round), in
    ``dtype``."""
    return jnp.power(jnp.asarray(decay, dtype), round_index.astype(dtype))


def check_decay(decay: float, name: str = "client learning-rate decay") -> None:
    if not 0 < decay <= 1:
        raise ValueError(f"{name} must lie in (0, 1], got {decay}")
