"""The tests marked ``slow`` from here, by name: the integration tier that `make test` (CI) runs
and `make test-fast` leaves out. Kept in one table, with the seconds each took, so that the
line between the two is drawn from measurements, not from each file's guess.

Each took 5 s or more in a `--durations` run of the suite without the notebooks (2 cores,
load average 10-19 from other work: about 2.5 times what a quiet machine takes); the tests
marked ``slow`` in their own file (the stress and repeat counts, the leak check's proof) are
not repeated here. The gloo-thread and resume tests were shortened since (fake MNIST instead
of the digits: their figure is the new one, at load 6-9), and the two bench tests are one.
Seconds by file and test; a name covers every parametrization of its test, and a name that
no longer exists fails tests/test_slow_list.py.
"""

from __future__ import annotations

SLOW = {
    "tests/course/test_allreduce.py": {
        "test_tiny_sweep_report_and_figures": 6,
    },
    "tests/course/test_ddp_basics.py": {
        "test_a_rank_missing_forward_hangs_the_others": 8,
    },
    "tests/course/test_debugging.py": {
        "test_ddp_segfaults_under_detail_with_plain_torchrun_and_runs_under_info": 13,
        "test_flight_recorder_analyzer_names_the_rank_that_did_not_join": 5,
    },
    "tests/course/test_failures.py": {
        "test_torchrun_past_its_timeout_is_stopped_with_all_its_workers": 20,
        "test_torchrun_error_files_hold_the_root_cause": 8,
    },
    "tests/course/test_hosts_demo.py": {
        "test_the_helpers_see_the_ranks_on_each_host_and_nothing_after_close": 5,
    },
    "tests/course/test_netns.py": {
        "test_late_node_grows_the_world_and_the_job_resumes": 45,
        "test_two_nodes_two_workers_each_all_reduce_across_namespaces": 20,
    },
    "tests/course/test_sharding.py": {
        "test_slow_link_all_gathers_what_each_setting_schedules": 24,
        "test_torch_variants_equal_one_process_on_three_ranks": 8,
        "test_prefetching_async_all_gathers_trains_like_one_process": 7,
        "test_a_checkpoint_saved_on_two_ranks_loads_on_three_and_one": 6,
    },
    "tests/course/test_training.py": {
        "test_worker_scripts_leave_no_gloo_thread_to_the_interpreters_exit": 10,
        "test_resumed_run_equals_uninterrupted_run": 10,
        "test_train_cnn_under_real_torchrun": 34,
        "test_destroy_joins_gloo_threads_only_if_torch_distributed_nn_came_first": 22,
        "test_training_learns_and_ranks_agree": 19,
        "test_train_cnn_script_via_run_script": 12,
        "test_digits_split_is_reproducible_and_disjoint": 10,
    },
    "tests/launch/test_forkserver_cold_start.py": {
        "test_res_seconds_is_the_call_s_wall_time_fork_server_start_included": 12,
        "test_a_slow_start_is_not_on_the_clock_of_the_first_run": 23,
        "test_a_new_server_stopped_while_it_imports_is_killed": 20,
    },
    "tests/launch/test_session_faults.py": {
        "test_sigkill_of_the_launcher_takes_the_ranks_down": 15,
        "test_a_dead_fork_server_is_replaced": 8,
        "test_ranks_failing_on_their_own_are_not_called_knock_on": 7,
    },
    "tests/launch/test_isolation_attacks.py": {
        "test_run_script_under_torchrun_is_out_of_reach": 5,
        "test_the_courses_torchrun_agent_is_out_of_reach": 5,
    },
    "tests/launch/test_api_run.py": {
        "test_two_launcher_processes_at_once_never_collide": 38,
    },
    "tests/launch/test_forkserver_leftovers.py": {
        "test_a_helper_in_its_own_session_dies_with_a_killed_launcher": 23,
        "test_a_fork_server_stopped_before_the_run_ends_the_run": 22,
        "test_a_fork_server_stopped_mid_run_ends_the_run": 18,
        "test_a_helper_of_a_torchrun_worker_does_not_outlive_the_run": 12,
        "test_semaphores_of_a_failing_spawn_pool_are_unlinked": 6,
    },
    "tests/launch/test_remote_ranks.py": {  # measured at load 2-3 (2 cores)
        "test_a_cut_link_leaves_nothing_on_the_host_and_the_call_says_so": 18,
        "test_a_failure_on_one_host_ends_the_wait_of_the_other_hosts_ranks": 16,
        "test_a_hang_shows_where_each_rank_waits_and_restarts_the_ranks": 14,
        "test_a_rank_that_dies_stops_every_host_and_restart_brings_new_ones": 9,
        "test_ctrl_c_while_the_hosts_start_leaves_nothing": 7,
        "test_the_stop_button_reaches_every_host": 6,
        "test_a_cell_runs_on_four_ranks_across_two_hosts_and_keeps_its_state": 5,
        "test_a_killed_kernel_leaves_nothing_on_either_host": 5,
        "test_a_stranger_at_the_controllers_port_is_refused_and_the_session_starts": 5,
        "test_an_error_on_one_host_keeps_every_rank_and_names_the_root_cause": 4,
    },
    "tests/launch/test_remote_run.py": {
        "test_run_on_two_hosts_returns_each_ranks_value_and_raises_a_one_shot_error": 10,
        "test_live_ranks_via_slurm_run_as_a_step_and_die_with_a_killed_kernel": 7,
    },
    "tests/launch/test_local_slurm.py": {
        "test_a_controller_that_cannot_start_says_why_and_leaves_nothing": 6,
    },
    "tests/launch/test_magic.py": {
        "test_network_gives_each_rank_a_shaped_link": 9,
    },
    "tests/launch/test_network_runs.py": {
        "test_sigkill_of_the_launcher_takes_the_namespaces_down": 21,
        "test_links_deliver_the_configured_bandwidth": 10,
    },
    "tests/launch/test_payload_sources.py": {
        "test_a_real_kernels_tutorial_function_shows_its_raising_line": 30,
    },
    "tests/launch/test_output_echo.py": {
        "test_every_line_reaches_the_logs_with_the_echo_on": 17,
    },
    "tests/launch/test_api_run_script.py": {
        "test_same_script_runs_under_real_torchrun_and_report_is_harmless": 26,
    },
    "tests/launch/test_mp_spawn.py": {
        "test_a_hang_under_spawn_times_out_with_stacks": 6,
    },
    "tests/launch/test_torchrun.py": {
        "test_elastic_launch_restarts_all_workers_after_a_crash": 40,
        "test_elastic_launch_runs_again_only_after_a_lost_port_race": 19,
        "test_hang_times_out_with_each_stuck_workers_stack": 25,
        "test_values_and_tagged_output_come_back_from_torchrun_workers": 19,
        "test_crash_names_the_root_cause_with_its_traceback": 19,
        "test_sigkill_of_the_launcher_takes_agent_workers_and_folder_down": 19,
        "test_exit_code_of_a_rank_that_exits_without_a_traceback": 12,
    },
    "tests/launch/test_rank_teardown.py": {
        "test_the_tutorials_cleanup_after_a_pause_does_not_hang": 9,
    },
    "tests/notebooks/test_kernel.py": {
        "test_kernel_output_interrupt_and_sigkill": 19,
    },
    "tests/notebooks/test_notebook_runner.py": {
        "test_solved_mode_runs_the_reference_in_the_exercise_cell": 42,
        "test_python_dash_m_ddp_lab": 11,
        "test_cli_exit_codes": 10,
        "test_run_all_writes_index_and_reports_progress": 9,
        "test_figures_are_kept_when_the_environment_says_mplbackend_agg": 6,
        "test_passing_notebook_is_executed_with_its_figure": 5,
    },
    "tests/tools/test_cli.py": {
        "test_bench_launch_reports_every_launcher_and_leaves_no_folder": 60,
        "test_bench_ddp_network_times_each_lesson_on_its_link": 14,
    },
    "tests/tools/test_bench_ranks_hosts.py": {  # 2 cores, load 3-4 from other helpers
        "test_engines_on_the_hosts_answer_in_rank_order_and_all_reduce_across_them": 12,
        "test_nothing_is_left_when_the_body_raises": 10,
        "test_the_controller_listens_on_the_link_only": 11,
        "test_the_whole_bench_in_one_run": 27,
    },
}


def is_slow(nodeid: str) -> bool:
    """Whether a collected test (``path::name`` or ``path::name[params]``) is in the table."""
    path, _, name = nodeid.partition("::")
    return name.split("[", 1)[0] in SLOW.get(path, {})
