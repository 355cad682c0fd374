import json
import subprocess
import sys


def test_info_runs():
    out = subprocess.run([sys.executable, "-m", "fp8ext.cli", "info", "--json"], check=True,
                         capture_output=True, text=True).stdout
    info = json.loads(out)
    assert info["formats"]["e5m2"]["max"] == 57344.0
    assert set(info["recipes"]) == {"CurrentScaling", "DelayedScaling", "PerTensorStatic", "RowWise", "BlockWise"}
    text = subprocess.run([sys.executable, "-m", "fp8ext.cli", "info"], check=True, capture_output=True,
                          text=True).stdout
    assert "e4m3: max 448" in text
