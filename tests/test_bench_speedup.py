"""benchmarks.bench_speedup's reading of its own live plain baselines."""

import polars as pl


def test_plain_spread_compares_each_rows_baseline_with_its_batch_sizes_median(capsys):
    from benchmarks.bench_speedup import plain_spread

    table = pl.DataFrame({"draft": ["a", "b", "c", "a", "b", "c"], "tree": ["chain:2"] * 6,
                          "batch": [1, 1, 1, 4, 4, 4],
                          "plain_tokens_per_s_live": [10.0, 20.0, 20.4, 40.0, 41.0, 44.0]})
    out = plain_spread(table)
    assert out["plain_live_vs_median"].to_list() == [0.5, 1.0, 20.4 / 20, 40 / 41, 1.0, 44 / 41]
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["plain decoding at B = 1, the same requests measured live 3 times in this run: 10.0-20.4 tok/s "
                       "(max/min 2.040); more than 5% from their median beside: a chain:2 (0.500)",  # not c's 1.02
                       "plain decoding at B = 4, the same requests measured live 3 times in this run: 40.0-44.0 tok/s "
                       "(max/min 1.100); more than 5% from their median beside: c chain:2 (1.073)"]
