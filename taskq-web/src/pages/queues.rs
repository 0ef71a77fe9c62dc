//! The queue actions: pause and resume a queue (from the overview).

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::{failure, see_other};
use crate::AppState;
use crate::ctx::Ctx;
use crate::html::error_page;

#[derive(Deserialize)]
pub(super) struct QueueForm {
    queue: String,
}

pub(super) async fn queue_pause(
    State(st): State<AppState>,
    Extension(ctx): Extension<Ctx>,
    axum::Form(f): axum::Form<QueueForm>,
) -> Response {
    match st.client.queue_exists(&f.queue).await {
        Ok(true) => {}
        Ok(false) => {
            return error_page(
                &ctx,
                StatusCode::NOT_FOUND,
                &crate::stats::unknown_queue(&f.queue),
            );
        }
        Err(e) => return failure(&ctx, &e),
    }
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
