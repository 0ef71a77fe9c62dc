//! The queue actions: pause and resume a queue (from the overview).

use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;

use super::{failure, see_other};
use crate::AppState;
use crate::auth::Ctx;

#[derive(Deserialize)]
pub(super) struct QueueForm {
    queue: String,
}

pub(super) async fn queue_pause(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<QueueForm>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(ctx.actor.clone())
        .pause_queue(&f.queue)
        .await
    {
        Ok(()) => see_other(&ctx.home),
        Err(e) => failure(&ctx, &e),
    }
}

pub(super) async fn queue_resume(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<QueueForm>,
) -> Response {
    match st
        .client
        .clone()
        .with_actor(ctx.actor.clone())
        .resume_queue(&f.queue)
        .await
    {
        Ok(_) => see_other(&ctx.home),
        Err(e) => failure(&ctx, &e),
    }
}
