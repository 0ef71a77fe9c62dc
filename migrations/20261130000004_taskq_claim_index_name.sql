-- taskq schema v4: `name` at the end of the claim index, so the claim's candidate read is
-- index-only. A worker reads candidates with `JSON_CONTAINS(<its names>, JSON_QUOTE(name))`;
-- pending tasks of a name no running worker handles (a rolling deploy, a retired task type)
-- stay pending and sort where their (priority, run_at, id) puts them, so a head scan steps
-- over them. Without `name` in the index each of them cost a primary-key lookup (a clustered
-- page visit, a disk read when the page is not cached); now it is one index entry.
-- The order (state, queue, priority, run_at, id) is unchanged; `id` is unique, so `name` adds
-- nothing to it. Key length: 1 + 258 + 2 + 8 + 8 + 1022 = 1299 bytes (utf8mb4), under
-- InnoDB's 3072. One ALTER: InnoDB builds the new index in place while writes go on, and the
-- old one serves reads until the switch.
ALTER TABLE taskq_tasks
    DROP INDEX ix_taskq_claim,
    ADD INDEX ix_taskq_claim (state, queue, priority, run_at, id, name);
