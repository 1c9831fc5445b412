"""``python -m benchmarks predict``: the tree models timed by their library and by the
tree kernel, with the two giving the same predictions."""

from benchmarks import predict_timing
from benchmarks.__main__ import main


def test_each_tree_model_is_timed_both_ways_and_predicts_the_same(tmp_path, capsys):
    assert main(["predict", "--batch", "32", "--budget", "0.01", "--repo", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| model | rows | library ms | tree kernel ms |")
    rows = {line.split("|")[1].strip(): line for line in table[2:]}
    assert sorted(rows) == sorted(predict_timing.TREE_MODELS)
    for model in predict_timing.TREE_MODELS:
        cells = [cell.strip() for cell in rows[model].split("|")[1:-1]]
        assert cells[1] == "32"
        assert float(cells[2]) > 0 and float(cells[3]) > 0
        assert cells[5] == "True", rows[model]  # the kernel predicts what the library does
        assert cells[6].startswith("the tree kernel ("), rows[model]
