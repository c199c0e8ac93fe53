import json

import pytest

from memgrad import cli


def test_profile_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    status = cli.main(["--depths", "2", "8", "--batch-size", "64", "--width", "128",
                       "--device", "CPU:0", "--json", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "peak MiB" in printed
    rows = json.loads(out.read_text())
    assert [row["depth"] for row in rows] == [2, 8]
    # A deeper plain network keeps more activations.
    assert rows[1]["peak_above_baseline_bytes"] > rows[0]["peak_above_baseline_bytes"]


def test_bad_device_is_one_line_and_nonzero(capsys):
    assert cli.main(["--depths", "2", "--device", "TPU:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memgrad-profile: error:") and "\n" not in err


def test_bad_arguments_exit_nonzero():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--depths", "0"])
    assert exit_info.value.code == 2
