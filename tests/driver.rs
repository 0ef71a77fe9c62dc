//! The driver test suite (`taskq-drivertest`) run on each driver: every behaviour of the seam
//! between taskq's runtime and its databases, written once, checked on MySQL / MariaDB
//! (`taskq_mysql::MySqlDriver`) and on SQLite (`taskq_sqlite::SqliteDriver`), each test on a fresh
//! migrated database (`fn::mysql`, `fn::sqlite`; MySQL prints SKIPPED without a server unless
//! `TASKQ_REQUIRE_MYSQL=1`).

use taskq_tests::backends::Db;
use taskq_tests::drivers::HasDriver;

/// One thin wrapper per suite function (its driver on the test's database, kept alive until
/// the test ends), run on both backends by `conformance!`.
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        $(
            async fn $name<B: HasDriver>(db: Db<B>) {
                taskq_drivertest::$name(B::store(db.pool.clone())).await;
                drop(db);
            }
        )*
        taskq_tests::conformance!($($name),*);
    };
}

suite!(
    // Batches.
    a_batch_releases_its_callbacks_once_when_its_last_member_ends,
    a_failed_member_cancels_on_success_until_its_retry_succeeds,
    the_sweep_counts_the_ends_the_write_back_did_not,
    an_open_batch_waits_for_its_seal_and_refuses_additions_once_complete,
    cancel_of_a_batch_cancels_its_members_and_callbacks,
    a_batch_is_pruned_once_its_tasks_are_gone_and_its_callbacks_ended,
    // Workflows.
    a_step_becomes_due_only_when_every_step_it_runs_after_succeeded,
    a_failed_step_cancels_the_steps_after_it_and_a_cleanup_step_still_runs,
    a_retried_dead_step_that_succeeds_brings_back_the_steps_it_canceled,
    the_sweep_settles_the_ends_the_write_back_did_not,
    cancel_of_a_workflow_cancels_its_steps_and_asks_the_running_ones_to_stop,
    a_rolled_back_workflow_leaves_nothing_and_workflows_list_newest_first,
    a_workflow_is_pruned_once_retention_pruned_all_its_tasks,
    a_success_stores_its_output_for_the_steps_after_it,
    // Events and the relay's keys.
    events_are_numbered_per_key_and_leased_once,
    an_expired_event_lease_is_taken_over_and_the_old_epoch_is_fenced,
    a_backed_off_key_waits_and_a_held_key_stays_out,
    a_claim_leases_keys_until_their_backlogs_fill_its_events,
    a_probing_claim_leases_the_same_keys,
    a_settle_of_many_keys_refuses_a_stale_epoch_per_key_and_settles_the_others,
    a_kept_lease_records_delivery_and_stays_with_its_relay,
    a_key_a_publisher_holds_is_settled_after_its_commit_and_the_publisher_commits,
    skipping_a_held_key_after_a_range_replay_keeps_the_replay,
    // Enqueue and reads of one task.
    insert_then_get_returns_every_field_as_inserted,
    an_idempotency_key_inserted_twice_returns_the_first_task,
    insert_rows_returns_the_new_ids_in_input_order,
    // Claims.
    a_claim_takes_due_tasks_by_priority_then_due_time_up_to_the_limit,
    a_second_claim_does_not_take_claimed_tasks_again,
    a_claim_expires_a_task_past_its_deadline_without_starting_it,
    // Leases: heartbeat, write-back, release, reap.
    heartbeat_renews_exactly_the_leases_sent_under_their_epoch,
    write_back_under_the_epoch_writes_the_outcome_and_fences_a_stale_one,
    the_attempt_history_records_each_written_outcome,
    release_returns_held_leases_to_pending,
    an_expired_lease_is_reaped_back_to_pending_keeping_its_run_at,
    a_reap_buries_a_last_attempt_or_parks_it_for_a_worker_that_knows_its_name,
    an_expired_lease_asked_to_cancel_is_reaped_to_canceled,
    a_follow_up_is_inserted_with_the_end_it_follows_and_never_for_a_fenced_one,
    // Operator actions and retention.
    cancel_ends_a_pending_task_only,
    a_cancel_request_is_recorded_on_a_running_task_only,
    retry_dead_moves_dead_tasks_back_to_pending,
    retry_dead_in_bulk_honours_the_queue_the_time_bound_and_the_limit,
    reschedule_moves_a_pending_task_only,
    set_priority_changes_a_pending_task_only,
    prune_deletes_old_terminal_tasks_of_the_state_only,
    delete_removes_a_task_that_is_not_running_and_its_identity,
    // The dashboard's pending views.
    pending_views_list_scheduled_and_retrying_tasks_by_due_time,
    run_times_are_read_from_the_successes_of_the_window,
    // Ordered tasks.
    ordered_tasks_run_one_at_a_time_per_key_in_enqueue_order,
    a_dead_head_that_skips_lets_its_key_go_on,
    cancel_and_delete_keep_a_keys_order,
    a_batch_cancel_of_a_head_and_the_tasks_behind_it_cancels_them_all,
    // Unique identities.
    an_identity_held_while_pending_is_freed_by_the_claim,
    an_identity_held_while_running_is_freed_by_the_write_back_that_ends_the_task,
    an_identity_held_while_running_is_freed_by_the_reap_that_ends_the_task,
    a_cancel_request_racing_the_reap_still_frees_the_identity,
    cancel_frees_an_identity_and_retry_dead_takes_it_back_or_names_the_holder,
    a_window_identity_outlives_a_success_until_its_window_ends,
    a_claim_that_expires_a_unique_task_frees_its_identity,
    // Queues.
    a_pause_is_recorded_listed_and_resumed,
    queue_limits_are_set_listed_and_cleared,
    a_limited_claim_honours_the_concurrency_limit,
    a_limited_claim_honours_the_rate_limit,
    a_task_a_limited_claim_expires_is_no_start,
    // Reads of many tasks.
    reads_page_count_and_group_tasks,
    // Schedules, workers, history, clock.
    a_schedule_fire_enqueues_its_ticks_once_by_compare_and_set,
    workers_are_recorded_listed_and_stopped,
    gone_workers_are_not_alive_and_old_rows_are_pruned,
    audit_entries_are_listed_newest_first_and_pruned_oldest_first,
    the_attempt_history_keeps_the_latest_100_entries_and_cuts_long_errors,
    a_follow_up_whose_key_is_taken_or_whose_reap_was_overtaken_inserts_nothing,
    ended_tasks_and_failed_attempts_are_counted_per_minute,
    the_database_clock_reads_the_same_through_every_call,
    the_statement_budget_fits_a_statement,
);
