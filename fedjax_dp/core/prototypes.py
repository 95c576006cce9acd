"""The prototype (Proto) transform of PFLDyn(Proto) (Acar et al. 2021; Snell et al. 2017; seed 004
Eq. 8): a client's personalised model built from a shared representation r_W and its own examples.

For class k, U^k = mean of r_W(x) over the client's examples of class k (Eq. 8); a query x is
labelled with the nearest prototype, argmin_k ||r_W(x) - U^k||^2 (the paper's d(., .), squared
Euclidean as in Snell et al.), and the differentiable loss is the softmax cross-entropy of the
logits -||r_W(x) - U^k||^2.

Classes without an example in the support set have no prototype: they are masked out of the softmax
and the argmin, and a query of such a class is left out of the loss (it has no target). In
evaluation a test example whose class is absent from the client's training data cannot be classified
correctly; it counts as an error (``personalized_unseen_fraction`` reports how many there were).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MASKED = -1e30  # the logit of a class without a prototype (finite: no inf - inf in gradients)


def class_prototypes(embeddings: jax.Array, labels: jax.Array, mask: jax.Array, num_classes: int):
    """``(prototypes (K, E), present (K,))``: class means of the real (``mask``) examples'
    embeddings."""
    onehot = jax.nn.one_hot(labels, num_classes, dtype=embeddings.dtype) * mask[:, None].astype(
        embeddings.dtype
    )
    counts = jnp.sum(onehot, axis=0)
    prototypes = (onehot.T @ embeddings) / jnp.maximum(counts, 1.0)[:, None]
    return prototypes, counts > 0


def prototype_logits(embeddings: jax.Array, prototypes: jax.Array, present: jax.Array) -> jax.Array:
    """(B, K) logits -||r(x) - U^k||^2, masked where class k has no prototype."""
    distances = jnp.sum((embeddings[:, None, :] - prototypes[None, :, :]) ** 2, axis=-1)
    return jnp.where(present[None, :], -distances, MASKED)


def prototype_loss(
    support_embeddings,
    support_labels,
    support_mask,
    query_embeddings,
    query_labels,
    query_mask,
    num_classes: int,
) -> jax.Array:
    """Mean cross-entropy of the query examples under the support set's prototypes (Eq. 12's
    f_n(T_n(w, D), D')); queries of a class absent from the support set, and padding, are left out
    (0 when none is left)."""
    prototypes, present = class_prototypes(
        support_embeddings, support_labels, support_mask, num_classes
    )
    logits = prototype_logits(query_embeddings, prototypes, present)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, query_labels)
    valid = query_mask & present[query_labels]
    return jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def prototype_correct(
    support_embeddings,
    support_labels,
    support_mask,
    query_embeddings,
    query_labels,
    num_classes: int,
) -> jax.Array:
    """1.0 where the nearest prototype's class is the query's label (per query example)."""
    prototypes, present = class_prototypes(
        support_embeddings, support_labels, support_mask, num_classes
    )
    predicted = jnp.argmax(prototype_logits(query_embeddings, prototypes, present), axis=-1)
    return (predicted == query_labels).astype(jnp.float32)
