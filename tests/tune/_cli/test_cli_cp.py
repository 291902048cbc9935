"""`tune cp NAME DEST [--make-parents] [-n/--no-clobber]` (tune/_cli/_cp.py)."""


def test_copies_a_recipe_to_a_file(tune, shipped, tmp_path):
    dest = tmp_path / "my_recipe.py"
    code, out, _ = tune("cp", "echo_single_device", str(dest))
    assert code == 0 and out == f"Copied echo_single_device to {dest}\n"
    assert dest.read_bytes() == (shipped / "recipes" / "echo_single_device.py").read_bytes()


def test_an_existing_directory_receives_the_file_under_its_own_name(tune, shipped, tmp_path):
    assert tune("cp", "toy/tiny_echo", str(tmp_path))[0] == 0
    assert (tmp_path / "tiny_echo.yaml").read_bytes() == (shipped / "configs" / "toy" / "tiny_echo.yaml").read_bytes()
    assert tune("cp", "dev/no_info", str(tmp_path))[0] == 0
    assert (tmp_path / "no_info.py").is_file()


def test_a_destination_without_suffix_gets_the_sources(tune, shipped, tmp_path):
    tune("cp", "toy/tiny_echo", str(tmp_path / "mine"))
    assert (tmp_path / "mine.yaml").is_file()


def test_no_clobber_keeps_an_existing_file_and_default_overwrites(tune, shipped, tmp_path):
    dest = tmp_path / "my.yaml"
    dest.write_text("mine\n")
    code, out, err = tune("cp", "-n", "toy/tiny_echo", str(dest))
    assert code == 0 and dest.read_text() == "mine\n" and "already exists (--no-clobber)" in err
    code, out, err = tune("cp", "--no-clobber", "toy/tiny_echo", str(dest))
    assert dest.read_text() == "mine\n"
    assert tune("cp", "toy/tiny_echo", str(dest))[0] == 0
    assert dest.read_text().startswith("# Fixture config")


def test_missing_parent_needs_make_parents(tune, shipped, tmp_path):
    dest = tmp_path / "a" / "b" / "my.yaml"
    code, _, err = tune("cp", "toy/tiny_echo", str(dest))
    assert code == 1 and f"directory {dest.parent} does not exist; pass --make-parents" in err
    assert tune("cp", "toy/tiny_echo", str(dest), "--make-parents")[0] == 0 and dest.is_file()
    code, _, _ = tune("cp", "toy/tiny_echo", str(tmp_path / "new_dir") + "/", "--make-parents")
    assert (tmp_path / "new_dir" / "tiny_echo.yaml").is_file()


def test_unknown_name_suggests_close_ones(tune, shipped, tmp_path):
    code, _, err = tune("cp", "echo_singel_device", str(tmp_path))
    assert code == 1 and "no recipe or config named 'echo_singel_device'; did you mean echo_single_device" in err
