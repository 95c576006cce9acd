"""PFLDyn(Proto): personalised federated learning with dynamic regularisation and the prototype
transform (Acar et al. 2021, "Debiasing Model Updates for Improving Personalized Federated
Training"), as seed 004 writes it (CUAG-PFL §5.2, Eq. 7-12 and Alg. 1 lines 9-29; ALGORITHMS.md §4).

The shared meta-model W is a representation r_W (``pfldyn.representation``: the model's output, or
its penultimate layer as in the authors' code, alpemreacar/PFL ``model.proto = True``); client n's
personalised model is the Proto transform T_n(W, D): class prototypes from D, nearest-prototype
prediction (``core.prototypes``). Round t, client n in the cohort, from w_{n,0} = w^t, P local steps
(``pfldyn.local_steps``), each with two fresh disjoint batches D, D' of B examples (one draw of 2B
without replacement, split in halves; ``Requirements.batches_per_step = 2``):

    w <- w - beta (grad f_n(T_n(w, D), D') + grad R(w)),   R(w) = -<w, g_n^t> + alpha/2 ||w -
    w^t||^2   (Eq. 12)

with weight decay (``client.weight_decay``, 1e-3 in the paper's experiments) and the client learning
rate beta x decay^t (``client.learning_rate``, ``client.lr_decay``). After P steps
g_n^{t+1} = g_n^t - alpha (w_n^{t+1} - w^t) (Alg. 1 line 18; per-client state, kept only by the
clients that ran; the others keep g_n) and the upload is Delta w_n = w_n^{t+1} - w^t (line 19).

Server (lines 26-29), Delta w the mean of the (reconstructed) uploads:
    g^{t+1} = g^t - alpha s Delta w,   w^{t+1} = w^t + Delta w - g^{t+1} / alpha.
Sign conventions are the seed's and FedDyn's (h = -g). The factor s is a stated choice
(``pfldyn.server_mean``): ``cohort`` (s = 1, the seed as written: Delta w averaged over the cohort
enters g in full) or ``population`` (s = |Q_t| / N, FedDyn's h^t = h^{t-1} - alpha (1/N) sum_{k in
P_t}, Acar et al. 2021 Alg. 1, which the seed cites). g starts at 0 for the server and every client.

Evaluation is personalised: every client builds prototypes from its own training data with the
current meta-model and is scored on its own test data (``personalized_correct``); the meta-model's
output is a representation, not class scores, so no central accuracy of the global model is reported
(``Requirements.global_classifier = False``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
import optax.tree_utils as otu

from fedjax_dp.algorithms import registry
from fedjax_dp.core import tree
from fedjax_dp.core.algorithm import (
    ClientOut,
    Requirements,
    ServerState,
    check_decay,
    init_server_state,
    lr_scale,
)
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.core.prototypes import prototype_correct, prototype_loss
from fedjax_dp.models import evaluation_model, model_names
from fedjax_dp.models.registry import has_penultimate

SERVER_MEANS = ("cohort", "population")
EVALUATED_MODELS = ("server", "client_mean")
REPRESENTATIONS = ("output", "penultimate")


@dataclasses.dataclass(frozen=True)
class PFLDynProto:
    """``apply(params, x) -> r_W(x)``: the model's forward pass; ``num_classes``: the label
    count."""

    apply: object
    num_classes: int
    client_optimizer: optax.GradientTransformation
    num_clients: int  # N, the population
    # the rest by keyword: a field added here cannot shift a builder's arguments
    _: dataclasses.KW_ONLY
    alpha: float = 0.1
    local_steps: int = 25
    server_mean: str = "cohort"
    client_lr_decay: float = 1.0
    unroll: int | bool = 1
    # r_W for personalised evaluation (default ``apply``; see ``models.evaluation_model``)
    evaluation_apply: object = None
    # server: w^{t+1} (Alg. 1) | client_mean: the authors' code (``evaluation_state``)
    evaluated_model: str = "server"

    def __post_init__(self):
        if not self.alpha > 0:
            raise ValueError(
                f"pfldyn.alpha must be > 0 (the server divides by it), got {self.alpha}"
            )
        if not self.local_steps >= 1:
            raise ValueError(f"pfldyn.local_steps P must be >= 1, got {self.local_steps}")
        if self.server_mean not in SERVER_MEANS:
            raise ValueError(
                f"pfldyn.server_mean {self.server_mean!r} unknown; use one of {SERVER_MEANS}"
            )
        if self.evaluated_model not in EVALUATED_MODELS:
            raise ValueError(
                f"pfldyn.evaluated_model {self.evaluated_model!r} unknown; use one of"
                f" {EVALUATED_MODELS}"
            )
        check_decay(self.client_lr_decay)

    @property
    def requirements(self) -> Requirements:
        return Requirements(
            client_state=True,
            personalized=True,
            sampled_steps=self.local_steps,
            batches_per_step=2,
            global_classifier=False,
        )

    def init(self, params, key=None) -> ServerState:
        # g^0
        return init_server_state(
            params, optax.identity(), extra=jax.tree_util.tree_map(jnp.zeros_like, params)
        )

    @property
    def keeps_models(self) -> bool:
        return self.evaluated_model == "client_mean"

    def client_state_init(self, params):
        """g_n^0 = 0; with ``evaluated_model='client_mean'`` also the client's latest local model,
        the initial model until it first takes part (as the authors' ``clnt_params_list``)."""
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {"g": zeros, "model": params} if self.keeps_models else zeros

    def evaluation_state(self, state: ServerState, client_states) -> ServerState:
        """The model personalised evaluation starts from: w^{t+1} (Alg. 1), or with ``client_mean``
        the mean over all N clients (``client_states`` stacked) of their latest local models, the
        model the PFLDyn authors' code reports (``avg_all`` / ``all_model`` in
        ``train_Meta_FedDyn_Proto``)."""
        if not self.keeps_models:
            return state
        return state.replace(
            params=jax.tree_util.tree_map(lambda m: jnp.mean(m, axis=0), client_states["model"])
        )

    def upload_template(self, params):
        return params

    def broadcast(self, state: ServerState):
        return state.params, state.round

    def meta_loss(self, params, batch, mask):
        """f_n(T_n(w, D), D'): the first half of the step's batch is D (prototypes), the second
        D'."""
        half = mask.shape[0] // 2
        embeddings = self.apply(params, batch["x"])
        return prototype_loss(
            embeddings[:half],
            batch["y"][:half],
            mask[:half],
            embeddings[half:],
            batch["y"][half:],
            mask[half:],
            self.num_classes,
        )

    def client_update(self, shared, client, own_state, key) -> ClientOut:
        params, round_index = shared
        own_gradient = own_state["g"] if self.keeps_models else own_state

        def hook(per_example_loss, w, batch, mask, step_key):
            return jax.value_and_grad(self.meta_loss)(w, batch, mask)

        def regularizer(w, w_t):  # R(w) = -<w, g_n^t> + alpha/2 ||w - w^t||^2
            return -otu.tree_vdot(w, own_gradient) + 0.5 * self.alpha * otu.tree_norm(
                otu.tree_sub(w, w_t), squared=True
            )

        train = make_local_trainer(
            None,
            self.client_optimizer,
            unroll=self.unroll,
            regularizer=regularizer,
            gradient_hook=hook,
        )
        trained, stats = train(
            params,
            client["batches"],
            client["mask"],
            client["key"],
            lr_scale(self.client_lr_decay, round_index),
        )
        delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
        new_gradient = jax.tree_util.tree_map(lambda g, d: g - self.alpha * d, own_gradient, delta)
        ok = tree.is_finite(delta) & jnp.isfinite(stats.loss)
        new_state = {"g": new_gradient, "model": trained} if self.keeps_models else new_gradient
        return ClientOut(delta, jnp.float32(1.0), new_state, stats.loss, ok, stats.data_loss)

    def server_update(self, state: ServerState, aggregate, key):
        mean = aggregate.mean
        share = aggregate.kept / self.num_clients if self.server_mean == "population" else 1.0
        gradient = jax.tree_util.tree_map(
            lambda g, d: g - self.alpha * share * d, state.extra, mean
        )
        params = jax.tree_util.tree_map(
            lambda w, d, g: w + d - g / self.alpha, state.params, mean, gradient
        )
        applies = aggregate.applies
        return (
            state.replace(
                params=tree.where(applies, params, state.params),
                extra=tree.where(applies, gradient, state.extra),
                round=state.round + 1,
            ),
            {},
        )

    def personalized_correct(
        self, state: ServerState, client_state, train: dict, test: dict
    ) -> jax.Array:
        """Per test example: 1.0 where the client's own prototypes (from all its training data under
        the current meta-model) label it correctly."""
        apply = self.evaluation_apply or self.apply
        support = apply(state.params, train["x"])
        return prototype_correct(
            support,
            train["y"],
            train["mask"],
            apply(state.params, test["x"]),
            test["y"],
            self.num_classes,
        )


def representation(model, which: str):
    """r_W: the model's ``output`` (its last layer, as wide as the class count) or its
    ``penultimate`` layer (the last hidden layer after its ReLU: ``model.proto = True`` in the
    PFLDyn authors' code)."""
    return (
        functools.partial(model.apply, penultimate=True) if which == "penultimate" else model.apply
    )


def build_pfldyn_algorithm(ctx) -> PFLDynProto:
    c, p = ctx.cfg, ctx.cfg.pfldyn
    return PFLDynProto(
        representation(ctx.model, p.representation),
        ctx.model.num_classes,
        ctx.client_optimizer(),
        ctx.num_clients,
        alpha=p.alpha,
        local_steps=p.local_steps,
        server_mean=p.server_mean,
        client_lr_decay=c.client.lr_decay,
        unroll=ctx.unroll,
        evaluation_apply=representation(evaluation_model(ctx.model), p.representation),
        evaluated_model=p.evaluated_model,
    )


def check_pfldyn(cfg, need) -> None:
    p = cfg.pfldyn
    need(p.alpha > 0, f"pfldyn.alpha must be > 0 (the server divides by it), got {p.alpha}")
    need(p.local_steps >= 1, f"pfldyn.local_steps P must be >= 1, got {p.local_steps}")
    need(
        p.server_mean in SERVER_MEANS,
        f"pfldyn.server_mean {p.server_mean!r} unknown; use one of {SERVER_MEANS}",
    )
    need(
        p.representation in REPRESENTATIONS,
        f"pfldyn.representation {p.representation!r} unknown; use one of {REPRESENTATIONS}",
    )
    need(
        p.representation != "penultimate" or has_penultimate(cfg.model.name),
        "pfldyn.representation='penultimate' needs a model with a hidden layer whose penultimate"
        f" features it builds prototypes on (apply(..., penultimate=True)), which"
        f" model.name={cfg.model.name!r} does not give; models that do:"
        f" {[n for n in model_names() if has_penultimate(n)]} (yours: a `penultimate` argument of"
        " its __call__, or ModelFunctions(features=...)), or use pfldyn.representation='output'",
    )
    need(
        p.evaluated_model in EVALUATED_MODELS,
        f"pfldyn.evaluated_model {p.evaluated_model!r} unknown; use one of {EVALUATED_MODELS}",
    )
    need(
        p.evaluated_model != "client_mean" or cfg.algorithm == "pfldyn_proto",
        "pfldyn.evaluated_model='client_mean' averages the clients' own (unreleased) models: only"
        f" for algorithm='pfldyn_proto' without DP, got algorithm={cfg.algorithm!r}",
    )


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "alpha": "PFLDyn: alpha of the dynamic regulariser (CUAG-PFL Eqs. 9-12)",
    "local_steps": "PFLDyn: local steps P, each two fresh batches of client.batch_size",
    "representation": (
        "PFLDyn: r_W for the prototypes: output (the model's last layer) | penultimate (the last "
        "hidden layer after its ReLU, as the PFLDyn authors' code)"
    ),
    "evaluated_model": (
        "PFLDyn: the model personalised from: server (w^{t+1}, Alg. 1) | client_mean (the mean of "
        "every client's latest local model, as the authors' code reports; pfldyn_proto only)"
    ),
    "server_mean": "PFLDyn: cohort (as written) | population (FedDyn's 1/N)",
}
registry.register_section(
    "pfldyn",
    docs=SECTION_DOCS,
    defaults={
        "alpha": 0.1,
        "local_steps": 25,
        "server_mean": "cohort",
        "representation": "output",
        "evaluated_model": "server",
    },
)
registry.register(
    "pfldyn_proto",
    build=lambda ctx: (build_pfldyn_algorithm(ctx), ()),
    sections=("pfldyn",),
    validate=check_pfldyn,
    unread=registry.SAMPLED_STEPS + registry.OWN_SERVER_STEP,
    privacy_keys=(),
    summary=(
        "PFLDyn(Proto) (Acar et al. 2021, seed 004): dynamic regularisation + prototype"
        " personalisation"
    ),
)
