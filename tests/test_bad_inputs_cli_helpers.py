"""The argument types and checks command modules call refuse bad values in one line, and create nothing."""

from __future__ import annotations

import pytest

from tests.bad_inputs_support import (
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

# --------------------------------------------------------------------------------------------
# The helpers command modules call


def test_comma_lists_refuse_empty_and_repeated_items():
    import argparse

    from polykv_search.cli.arg_types import comma_list, positive_int

    budgets = comma_list(positive_int, "budget")
    assert budgets(" 32, 64 ,128") == [32, 64, 128]
    for text, message in [
        ("32,,64", "empty budget"),
        ("", "comma-separated list"),
        ("32,32", "repeated budget"),
        ("32,-1", "'-1' in '32,-1': expected a positive integer"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            budgets(text)


def test_number_types_refuse_nan_infinities_and_out_of_range_values():
    import argparse

    from polykv_search.cli.arg_types import finite_float, non_negative_float, non_negative_int, positive_float

    assert (finite_float("-2.5"), non_negative_float("0"), positive_float("1"), non_negative_int("0")) == (
        -2.5,
        0.0,
        1.0,
        0,
    )
    for parse, text in [
        (finite_float, "nan"),
        (finite_float, "-inf"),
        (non_negative_float, "-0.1"),
        (positive_float, "0.5"),
        (positive_float, "inf"),
        (non_negative_int, "-1"),
        (non_negative_int, "1.5"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_output_checks_create_nothing(tmp_path):
    from polykv_search.cli.common import CLIError, check_output_dir, check_output_path

    assert check_output_path(tmp_path / "new" / "deeper" / "o.json") == tmp_path / "new" / "deeper" / "o.json"
    assert check_output_dir(tmp_path / "folder") == tmp_path / "folder"
    assert list(tmp_path.iterdir()) == []  # the missing folders can be made, but were not
    (tmp_path / "file").write_text("x")
    with pytest.raises(CLIError, match="--out .*file: exists and is not a directory"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(CLIError, match="--json .*: is a directory"):
        check_output_path(tmp_path, "--json")


def test_read_json_names_the_file_and_refuses_nan(tmp_path):
    from polykv_search.cli.common import CLIError, read_json

    path = tmp_path / "r.json"
    path.write_text('{"score": NaN}')
    with pytest.raises(CLIError, match=r"--results .*r.json: NaN is not a valid JSON number"):
        read_json(path, "--results")
    path.write_text('{"score": 1.5}')
    assert read_json(path) == {"score": 1.5}
