"""Unbiased Gradient Aggregation (UGA; "Federated Learning with Unbiased Gradient Aggregation and
Controllable Meta Updating", seed 002 §3.1, Alg. 1; ALGORITHMS.md §2).

Client k in round t with E local epochs:
  1. keep-trace SGD: the first E-1 epochs of minibatch steps w^{k(i)} = w^{k(i-1)} - eta grad
     L(w^{k(i-1)}; B^{k(i)}) (Eq. 11) run as a differentiable function h_k of w_t
     (``core.local_training`` under ``lax.scan``; nothing is cut from the graph);
  2. gradient evaluation: in the last epoch the loss of the final weights on the whole local data,
     differentiated through the trajectory: g^k = grad_{w_t} L(h_k(w_t); D_k) (Eqs. 15-19).
     ``jax.vjp`` through the scan yields the Hessian-vector products; no second derivative is
     written by hand.
Server: w_{t+1} = w_t - eta_g sum_{k in S_t} (n_k / n_{S_t}) g^k: the client uploads -g^k with
weight n_k and any optax server optimizer applies the mean (SGD with learning rate eta_g is the
paper's rule).

With E = 1 the trajectory is empty and g^k = grad L(w_t; D_k): FedSGD. Options: ``remat``
rematerialises local steps in the backward pass (``jax.checkpoint``); ``first_order`` stops the
gradient through each inner gradient (the first-order approximation).
"""

from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core import tree
from fedjax_dp.core.algorithm import Requirements
from fedjax_dp.core.local_training import (
    DATA_GRADIENT_REDUCTIONS,
    make_data_value_and_grad,
    make_local_trainer,
)


def make_uga_gradient(
    per_example_loss,
    client_optimizer,
    *,
    unroll=1,
    remat=False,
    first_order=False,
    regularizer=None,
    reduction="mean",
):
    """``uga_gradient(params, client, lr_scale=1) -> (g, stats, ok)`` for one packed client.

    ``client`` holds ``batches``/``mask`` (the E-1 keep-trace epochs) and
    ``eval_batches``/``eval_mask`` (the whole local data, once). ``stats.loss`` (and ``data_loss``)
    is L(h_k(w_t); D_k); ``ok`` says g and the loss are finite.
    ``reduction`` is ``core.local_training.make_data_value_and_grad``'s (see
    ``UGA.gradient_reduction``).
    """
    train = make_local_trainer(
        per_example_loss,
        client_optimizer,
        unroll=unroll,
        regularizer=regularizer,
        remat=remat,
        first_order=first_order,
    )
    data_value_and_grad = make_data_value_and_grad(per_example_loss, reduction)

    def uga_gradient(params, client, lr_scale=1.0):
        for name in ("eval_batches", "eval_mask"):
            if name not in client:
                raise ValueError(
                    f"UGA needs each client's whole data as {name!r}: pack the cohort with "
                    "data.packing.pack_uga_cohort"
                )
        # its own key: client["key"] is split into the local steps (core.rng)
        eval_key = client["eval_key"]

        def trajectory(initial):  # h_k: w_t -> the weights after the E-1 keep-trace epochs
            return train(initial, client["batches"], client["mask"], client["key"], lr_scale)

        # g^k = (dh_k/dw_t)^T grad L(h_k(w_t); D_k): the whole-data gradient, accumulated batch by
        # batch,
        # pulled back through the trajectory by its VJP (Hessian-vector products through the scan).
        trained, pull_back, stats = jax.vjp(trajectory, params, has_aux=True)
        loss, final_grad = data_value_and_grad(
            trained, client["eval_batches"], client["eval_mask"], eval_key
        )
        (grad,) = pull_back(final_grad)
        ok = tree.is_finite(grad) & jnp.isfinite(loss)
        return grad, stats._replace(loss=loss, data_loss=loss), ok

    return uga_gradient


# its own fields by keyword: a new FedAvg field cannot shift them
@dataclasses.dataclass(frozen=True, kw_only=True)
class UGA(FedAvg):
    """UGA clients in FedAvg's weighted mean: the upload is -g^k.

    ``gradient_reduction``: ``mean`` is Eq. 13 as written (g^k of the mean loss over D_k). Then the
    server moves eta_g times one mean gradient per round, and with the paper's eta_g = eta = 0.002
    UGA at E = 1 is FedSGD at 0.002 (experiments/RESULTS.md). ``sum_of_batch_means`` sums each
    evaluation batch's mean-loss gradient, as a PyTorch loop of ``loss.backward()`` over the
    client's batches accumulates it: a labelled reading of an unstated implementation detail, not
    the paper's text.
    """

    remat: bool | int | str = False
    first_order: bool = False
    gradient_reduction: str = "mean"
    # batch of the whole-data gradient evaluation; 0 = the client batch size
    eval_batch_size: int = 0

    @property
    def requirements(self) -> Requirements:
        return Requirements(evaluation_pass=True, evaluation_batch_size=self.eval_batch_size)

    def local_upload(self, params, client, scale):
        gradient = make_uga_gradient(
            self.per_example_loss,
            self.client_optimizer,
            unroll=self.unroll,
            remat=self.remat,
            first_order=self.first_order,
            regularizer=self.regularizer(),
            reduction=self.gradient_reduction,
        )
        grad, stats, ok = gradient(params, client, scale)
        return jax.tree_util.tree_map(jnp.negative, grad), stats, ok


def remat_option(text: str):
    """Config ``uga.remat`` -> ``make_local_trainer``'s ``remat`` (off, step, sqrt or a segment
    length)."""
    text = str(text)
    if text in ("off", "step", "sqrt"):
        return {"off": False, "step": True, "sqrt": "sqrt"}[text]
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"uga.remat must be off, step, sqrt or a segment length >= 1, got {text!r}")


def build_uga(ctx) -> tuple:
    u = ctx.cfg.uga
    return (
        UGA(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            **ctx.client_fields(),
            remat=remat_option(u.remat),
            first_order=u.first_order,
            gradient_reduction=u.gradient_reduction,
            eval_batch_size=u.eval_batch_size,
        ),
        (),
    )


def check_uga(cfg, need) -> None:
    u = cfg.uga
    remat = str(u.remat)
    need(
        remat in ("off", "step", "sqrt") or (remat.isdigit() and int(remat) >= 1),
        f"uga.remat must be off, step, sqrt or a segment length >= 1, got {u.remat!r}",
    )
    need(
        u.gradient_reduction in DATA_GRADIENT_REDUCTIONS,
        f"uga.gradient_reduction must be one of {DATA_GRADIENT_REDUCTIONS}, got"
        f" {u.gradient_reduction!r}",
    )
    need(u.eval_batch_size >= 0, f"uga.eval_batch_size must be >= 0, got {u.eval_batch_size}")


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "remat": (
        "UGA: off | step | sqrt | <k>: rematerialise every step / sqrt(S)-step / k-step segments"
    ),
    "first_order": "UGA: stop gradients through inner gradients (first-order UGA)",
    "gradient_reduction": "UGA: mean (Eq. 13 as written) | sum_of_batch_means",
    "eval_batch_size": "UGA: batch of the whole-data gradient evaluation (0 = client.batch_size)",
}
registry.register_section(
    "uga",
    docs=SECTION_DOCS,
    defaults={
        "remat": "off",
        "first_order": False,
        "gradient_reduction": "mean",
        "eval_batch_size": 0,
    },
)
registry.register(
    "uga",
    build=build_uga,
    sections=("uga",),
    validate=check_uga,
    privacy_keys=(),
    scaled_rates=True,
    summary="UGA (seed 002): gradients through unrolled local training",
)
