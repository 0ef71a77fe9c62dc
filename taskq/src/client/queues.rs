//! The client's queue controls: pause, resume, concurrency and rate limits, the queue list.

use super::*;

impl Client {
    /// Pauses `queue`: workers stop claiming from it within about a second (running tasks
    /// finish normally; enqueues still work). Idempotent.
    pub async fn pause_queue(&self, queue: &str) -> Result<()> {
        crate::defaults::validate_name("queue", queue, crate::defaults::MAX_QUEUE_LEN)?;
        let mut tx = self.run(self.store.begin()).await?;
        self.run(self.store.queue_pause(tx.conn(), queue)).await?;
        let a = Action::queue("pause", Some(queue), serde_json::Value::Null);
        self.commit_audited(tx, &Action { detail: None, ..a }).await
    }

    /// Resumes a paused queue; returns whether it was paused.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        crate::defaults::validate_name("queue", queue, crate::defaults::MAX_QUEUE_LEN)?;
        let mut tx = self.run(self.store.begin()).await?;
        let was_paused = self.run(self.store.queue_resume(tx.conn(), queue)).await?;
        if was_paused {
            let a = Action::queue("resume", Some(queue), serde_json::Value::Null);
            self.commit_audited(tx, &Action { detail: None, ..a })
                .await?;
        }
        crate::wake::notify(queue);
        Ok(was_paused)
    }

    /// Paused queues and when each was paused.
    pub async fn paused_queues(&self) -> Result<Vec<(String, DateTime<Utc>)>> {
        let mut conn = self.run(self.store.acquire()).await?;
        self.run(self.store.queues_paused(conn.conn())).await
    }

    /// Sets the concurrency limit of `queue` across every worker (`Some(n)`, 1 ..=
    /// [`MAX_QUEUE_LIMIT`]), or clears it (`None`). Stored in the database, so it holds for
    /// the whole fleet and changes without restarting workers:
    ///
    /// * a claim of a limited queue locks the queue's row, counts the queue's running tasks
    ///   and claims at most the difference, so the running tasks of the queue never exceed
    ///   the limit. Tasks whose lease expired but which the reaper has not returned yet still
    ///   count (they may still be running).
    /// * Each worker learns that a queue has become limited (or no longer is) when it
    ///   re-reads `taskq_queues`, once per poll ceiling (1 s by default): until then a worker
    ///   that saw the queue unlimited claims without looking at the limit. Set the limit before
    ///   starting workers, or allow that interval, for it to hold from the start. A change of
    ///   the number on an already limited queue is read by the next claim.
    /// * Lowering the limit below the running count stops nothing: those tasks finish, and
    ///   the queue starts nothing new until it is under the limit.
    ///
    /// A limit of 0 or above [`MAX_QUEUE_LIMIT`] is [`Error::InvalidOption`] (to stop a queue,
    /// [`pause_queue`](Self::pause_queue)); nothing is written then. Clearing a queue without
    /// a limit changes nothing. Recorded in the audit trail as `limit` (detail
    /// `{"concurrency_limit": n | null}`), in the transaction of the change.
    pub async fn set_queue_limit(&self, queue: &str, limit: Option<u32>) -> Result<()> {
        crate::defaults::validate_name("queue", queue, crate::defaults::MAX_QUEUE_LEN)?;
        if let Some(n) = limit
            && !(1..=MAX_QUEUE_LIMIT).contains(&n)
        {
            return Err(Error::InvalidOption(format!(
                "concurrency limit of queue {queue:?} must be between 1 and {MAX_QUEUE_LIMIT}, got {n} (to stop the queue, pause it)"
            )));
        }
        let mut tx = self.run(self.store.begin()).await?;
        self.run(self.store.queue_set_limit(tx.conn(), queue, limit))
            .await?;
        let detail = serde_json::json!({ "concurrency_limit": limit });
        self.commit_audited(tx, &Action::queue("limit", Some(queue), detail))
            .await
    }

    /// Sets the rate limit of `queue` across every worker: at most `max` tasks start in each
    /// window of `period` (`Some((max, period))`), or clears it (`None`).
    ///
    /// Windows are consecutive multiples of `period` on the database clock (a one-minute
    /// period has windows starting on the minute); a claim counts in the window of its claim
    /// statement and takes no more than the window has left, so no window holds more than
    /// `max` starts. As with any fixed window, up to `2 × max` can start within one period
    /// that straddles a window boundary. A task starts running a few milliseconds after its
    /// claim, so its handler may begin in the next window. Learned by workers like
    /// [`set_queue_limit`](Self::set_queue_limit) (within the poll ceiling). Changing `max`
    /// keeps the current window's count; changing `period` starts counting afresh.
    ///
    /// `max` of 0 or above [`MAX_QUEUE_LIMIT`], or a period shorter than [`MIN_RATE_PERIOD`]
    /// or longer than [`MAX_RATE_PERIOD`], is [`Error::InvalidOption`]; nothing is written.
    /// Recorded in the audit trail as `rate_limit` (detail `{"rate_limit": {"max", "period_ms"}
    /// | null}`), in the transaction of the change.
    pub async fn set_queue_rate_limit(
        &self,
        queue: &str,
        rate: Option<(u32, std::time::Duration)>,
    ) -> Result<()> {
        crate::defaults::validate_name("queue", queue, crate::defaults::MAX_QUEUE_LEN)?;
        let rate = match rate {
            None => None,
            Some((max, period)) => {
                if !(1..=MAX_QUEUE_LIMIT).contains(&max) {
                    return Err(Error::InvalidOption(format!(
                        "rate limit of queue {queue:?} must allow between 1 and {MAX_QUEUE_LIMIT} starts per period, got {max}"
                    )));
                }
                if !(MIN_RATE_PERIOD..=MAX_RATE_PERIOD).contains(&period) {
                    return Err(Error::InvalidOption(format!(
                        "rate limit period of queue {queue:?} must be between 1 ms and 366 days, got {period:?}"
                    )));
                }
                Some((max, period.as_micros() as i64))
            }
        };
        let mut tx = self.run(self.store.begin()).await?;
        self.run(self.store.queue_set_rate_limit(tx.conn(), queue, rate))
            .await?;
        let detail = match rate {
            Some((max, period_us)) => {
                serde_json::json!({ "rate_limit": { "max": max, "period_ms": period_us / 1_000 } })
            }
            None => serde_json::json!({ "rate_limit": null }),
        };
        self.commit_audited(tx, &Action::queue("rate_limit", Some(queue), detail))
            .await
    }

    /// Whether anything names `queue`: a queue row (paused or limited before), its pending or
    /// running tasks, a live worker that serves it, or any task at all. Pausing creates the
    /// queue's row, so pausing a name nothing uses (a typo) would pause nothing, silently: the
    /// dashboard refuses that with this check. A blank name counts as named, for the call
    /// that follows to refuse it as invalid. Up to three reads.
    pub async fn queue_exists(&self, queue: &str) -> Result<bool> {
        if queue.trim().is_empty() || self.queues().await?.iter().any(|q| q.queue == queue) {
            return Ok(true);
        }
        if self
            .workers()
            .await?
            .iter()
            .any(|w| w.queues.contains_key(queue))
        {
            return Ok(true);
        }
        let any = ListFilter {
            queue: Some(queue.to_owned()),
            limit: Some(1),
            ..Default::default()
        };
        Ok(!self.list(&any).await?.is_empty())
    }

    /// Every queue that has pending or running tasks, or that was ever paused or limited, by
    /// name: whether it is paused, its limits, the starts counted in its current rate window,
    /// and its pending and running counts. Two statements; the counts read every pending and
    /// running task's index entry, so they cost in proportion to the backlog.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>> {
        let rows = self.run(self.store.queue_list()).await?;
        Ok(rows
            .into_iter()
            .map(|r| QueueInfo {
                queue: r.queue,
                paused_at: r.paused_at,
                concurrency_limit: r.concurrency_limit,
                rate_limit: r.rate.map(|(max, us)| RateLimit {
                    max,
                    period: std::time::Duration::from_micros(us as u64),
                }),
                rate_used: r.rate_used,
                pending: r.pending,
                running: r.running,
            })
            .collect())
    }
}
