"""The experiment loop: sampling, local training, aggregation, evaluation, logging."""
