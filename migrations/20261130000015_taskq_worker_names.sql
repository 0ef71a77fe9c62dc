-- taskq schema v15: the task names each worker registers, on its row in taskq_workers.
--   names: JSON array of the task names the worker has handlers for, written at start and by
--     every presence beat that inserts the row. With the queues it works, it says which due
--     pending tasks no live worker will claim: workers log them at WARN, `taskq names`, the
--     dashboard and `Client::unhandled` show them. NULL: a row written by a worker of an
--     earlier version, taken as registering every name.
ALTER TABLE taskq_workers ADD COLUMN names TEXT NULL;
