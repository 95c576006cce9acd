"""experiments/compression_subspace.py: with Alg. 3's fixed block matrix a layer's movement is
constant within every block over a whole run; with ``compression.refresh='round'`` it is not."""

from conftest import load_experiment
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


def test_a_fixed_block_matrix_confines_the_run_and_a_refreshed_one_does_not(tmp_path):
    script = load_experiment("compression_subspace")
    spreads = {}
    for refresh in ("fixed", "round"):
        c = default_config()
        c.rounds, c.eval_every, c.data.num_clients, c.sampling.cohort_size = 3, 3, 20, 4
        c.client.update(epochs=1, batch_size=50, learning_rate=0.5)
        c.compression.update(enabled=True, rates="0.5", refresh=refresh)
        run_experiment(c, str(tmp_path / refresh), progress=False)
        rows = script.layer_spreads(str(tmp_path / refresh))
        assert all(row["rates"] == [0.5] for row in rows)
        spreads[refresh] = [(row["within_block_spread"], row["max_movement"]) for row in rows]
    assert (
        max(spread for spread, _ in spreads["fixed"])
        < 1e-6
        < 1e-2
        < min(moved for _, moved in spreads["fixed"])
    )
    assert all(spread > 0.1 * moved for spread, moved in spreads["round"] if moved > 1e-3)
