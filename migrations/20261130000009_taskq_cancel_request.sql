-- taskq schema v9: cancelling running tasks.
-- * `cancel_requested_at`: when `Client::cancel` asked a running task to stop (database clock);
--   NULL = no request. The heartbeat does not renew a lease whose row carries a request, so the
--   worker's existing follow-up read learns of it; the reaper turns an expired lease of such a
--   row into `canceled` instead of `pending`. Read only by primary key: no index.
-- Appended (no AFTER), so both servers add it in place without a table rebuild.
ALTER TABLE taskq_tasks
    ADD COLUMN cancel_requested_at DATETIME(6) NULL;
