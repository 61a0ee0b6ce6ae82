"""What the kernel and the ranks share: the environment a rank starts with, the run folder."""

from __future__ import annotations

from ddp_lab.launch.config import threads_per_rank


def test_threads_per_rank_never_below_one():
    assert threads_per_rank(1000) == 1
    assert threads_per_rank(1) >= 1


def test_a_run_folder_is_private_and_says_whose_it_is():
    import os
    import shutil
    import stat

    from ddp_lab.launch.config import RUN_DIR_PREFIX, new_run_dir
    folder = new_run_dir()
    try:
        assert os.path.basename(folder).startswith(f"{RUN_DIR_PREFIX}{os.getpid()}-")
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    finally:
        shutil.rmtree(folder)


def test_a_rank_is_placed_as_its_run_is():
    """The rank's namespace flag and the interface gloo and NCCL use come from the run's
    placement (network/placement.py): the loopback, or the rank's shaped link."""
    from ddp_lab.launch.config import LaunchConfig, loopback_interface, rank_spec, run_env
    from ddp_lab.launch.network.placement import OnShapedLinks
    from ddp_lab.launch.network.setting import Network
    from ddp_lab.launch.network.switch import RANK_LINK
    plain = LaunchConfig(world_size=2, backend="gloo", timeout=5.0, env={})
    shaped = LaunchConfig(world_size=2, backend="gloo", timeout=5.0, env={},
                          placement=OnShapedLinks(Network("1gbit")))
    for config, netns, interface in ((plain, False, loopback_interface()),
                                     (shaped, True, RANK_LINK)):
        env = run_env(config, 29500, "/tmp/run", address="10.0.0.254")
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == interface
        assert rank_spec(config, 1, "/tmp/run", env).network is netns
    assert plain.network is None and shaped.network == Network("1gbit")
