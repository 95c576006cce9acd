"""Unbiased Gradient Aggregation (UGA; "Federated Learning with Unbiased Gradient Aggregation and
Controllable Meta Updating", seed 002 §3.1, Alg. 1; ALGORITHMS.md §2).

Client k in round t with E local epochs:
  1. keep-trace SGD: the first E-1 epochs of minibatch steps w^{k(i)} = w^{k(i-1)} - eta grad L(w^{k(i-1)};
     B^{k(i)}) (Eq. 11) run as a differentiable function h_k of w_t (``core.local_training`` under
     ``lax.scan``; nothing is cut from the graph);
  2. gradient evaluation: in the last epoch the loss of the final weights on the whole local data,
     differentiated through the trajectory: g^k = grad_{w_t} L(h_k(w_t); D_k) (Eqs. 15-19). ``jax.grad``
     through the scan yields the Hessian-vector products; no second derivative is written by hand.
Server: w_{t+1} = w_t - eta_g sum_{k in S_t} (n_k / n_{S_t}) g^k, through any optax server optimizer
(SGD with learning rate eta_g is the paper's rule).

With E = 1 the trajectory is empty and g^k = grad L(w_t; D_k): FedSGD. Options: ``remat``
rematerialises each local step in the backward pass (``jax.checkpoint``: memory stays at the carried
parameters per step instead of every step's activations); ``first_order`` stops the gradient through
each inner gradient (for SGD then g^k = grad L(w_final; D_k), the first-order approximation).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core import rng, tree
from fedjax_dp.core.local_training import make_data_value_and_grad, make_local_trainer


def make_uga_gradient(per_example_loss, client_optimizer, *, unroll=1, remat=False, first_order=False, regularizer=None,
                      reduction="mean"):
    """``uga_gradient(params, client, lr_scale=1) -> (g, stats, ok)`` for one packed client.

    ``client`` holds ``batches``/``mask`` (the E-1 keep-trace epochs) and ``eval_batches``/``eval_mask``
    (the whole local data, once). ``stats.loss`` is L(h_k(w_t); D_k); ``ok`` says g and the loss are finite.
    ``reduction`` is ``core.local_training.make_data_value_and_grad``'s (see ``UGA.gradient_reduction``).
    """
    train = make_local_trainer(per_example_loss, client_optimizer, unroll=unroll, regularizer=regularizer,
                               remat=remat, first_order=first_order)
    data_value_and_grad = make_data_value_and_grad(per_example_loss, reduction)

    def uga_gradient(params, client, lr_scale=1.0):
        for name in ("eval_batches", "eval_mask"):
            if name not in client:
                raise ValueError(f"UGA needs each client's whole data as {name!r}: pack the cohort with "
                                 "data.packing.pack_uga_cohort")
        eval_key = rng.purpose_key(client["key"], rng.Purpose.EVALUATION)

        def trajectory(initial):  # h_k: w_t -> the weights after the E-1 keep-trace epochs
            return train(initial, client["batches"], client["mask"], client["key"], lr_scale)

        # g^k = (dh_k/dw_t)^T grad L(h_k(w_t); D_k): the whole-data gradient, accumulated batch by batch,
        # pulled back through the trajectory by its VJP (Hessian-vector products through the scan).
        trained, pull_back, stats = jax.vjp(trajectory, params, has_aux=True)
        loss, final_grad = data_value_and_grad(trained, client["eval_batches"], client["eval_mask"], eval_key)
        (grad,) = pull_back(final_grad)
        ok = tree.is_finite(grad) & jnp.isfinite(loss)
        return grad, stats._replace(loss=loss), ok

    return uga_gradient


@dataclasses.dataclass(frozen=True)
class UGA(FedAvg):
    """UGA clients in the weighted-mean server of ``FedAvg``: the pseudo-gradient is g^k itself.

    ``gradient_reduction``: ``mean`` is Eq. 13 as written (g^k of the mean loss over D_k). Then the
    server moves eta_g times one mean gradient per round, and with the paper's eta_g = eta = 0.002 UGA
    at E = 1 is FedSGD at 0.002: on CIFAR-10 it stays at 14-16 % after 100 rounds where FedAvg reaches
    48-63 % (experiments/RESULTS.md). ``sum_of_batch_means`` sums each evaluation batch's mean-loss
    gradient, as a PyTorch loop of ``loss.backward()`` over the client's batches accumulates it: the
    step grows with the number of batches, like FedAvg's displacement from as many local steps. This is
    a reading of an unstated implementation detail, labelled as such, not the paper's text.
    """

    remat: bool = False
    first_order: bool = False
    gradient_reduction: str = "mean"

    needs_evaluation_pass: ClassVar[bool] = True

    def make_client_update(self):
        return make_uga_gradient(self.per_example_loss, self.client_optimizer, unroll=self.unroll, remat=self.remat,
                                 first_order=self.first_order, regularizer=self.regularizer(),
                                 reduction=self.gradient_reduction)


def as_client_delta(uga_gradient):
    """UGA's g^k as the ``(params, client) -> (delta, stats, ok)`` DP-FedAvg clips and noises:
    delta = -g^k, so DP-FedAvg's server step w + mean(delta) is w - mean(g^k) (DP-UGA)."""

    def client_delta(params, client, lr_scale=1.0):
        grad, stats, ok = uga_gradient(params, client, lr_scale)
        return jax.tree_util.tree_map(jnp.negative, grad), stats, ok

    return client_delta
