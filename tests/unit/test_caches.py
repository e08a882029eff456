"""Where trainbox points torch's compile cache: under the user's cache directory, never /tmp."""

from __future__ import annotations

from pathlib import Path

from trainbox.process import caches


def test_compile_cache_goes_under_home(tmp_path: Path) -> None:
    cache = caches.compile_cache({"HOME": str(tmp_path)})
    want = tmp_path / ".cache" / "trainbox" / "torchinductor"
    assert (cache.path, cache.source) == (str(want), "HOME")
    assert cache.env == {"TORCHINDUCTOR_CACHE_DIR": str(want)}
    assert want.is_dir()


def test_compile_cache_follows_xdg_cache_home(tmp_path: Path) -> None:
    cache = caches.compile_cache({"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path)})
    assert cache.path == str(tmp_path / "trainbox" / "torchinductor")


def test_a_compile_cache_the_user_set_is_kept_as_it_is(tmp_path: Path) -> None:
    mine = str(tmp_path / "mine")
    cache = caches.compile_cache({"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": mine})
    assert (cache.path, cache.source, cache.env) == (mine, "TORCHINDUCTOR_CACHE_DIR", {})
    assert not (tmp_path / ".cache").exists()


def test_an_unwritable_home_leaves_torch_its_default_and_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("a file, so nothing can be made under it")
    cache = caches.compile_cache({"HOME": str(home)})
    assert cache.env == {}
    assert cache.path.endswith("torchinductor_<user>")
    assert cache.source.startswith(f"torch's default: {home}/.cache/trainbox/torchinductor ")
