//! `taskq web`: the dashboard of `taskq-web`, served until Ctrl-C or SIGTERM.

use taskq::Client;

use crate::args::WebArgs;
use crate::failure::{EXIT_OTHER, EXIT_USAGE, Failure};

/// `taskq web`: serves the dashboard until Ctrl-C (or SIGTERM).
pub async fn web(client: Client, args: &WebArgs) -> Result<(), Failure> {
    let mut builder = taskq_web::Dashboard::builder_with_client(client)
        .read_only(args.read_only)
        .secure_cookies(args.secure_cookies);
    if let Some(token) = &args.token {
        builder = builder.bearer_token(token.clone());
    }
    if let Some(basic) = &args.basic {
        let Some((user, password)) = basic.split_once(':') else {
            return Err(Failure::new(EXIT_USAGE, "--basic takes USER:PASSWORD"));
        };
        builder = builder.basic_auth(user, password);
    }
    if args.insecure_no_auth {
        builder = builder.insecure_no_auth();
    }
    let dashboard = builder
        .build()
        .map_err(|e| Failure::new(EXIT_USAGE, e.to_string()))?;
    let prefix = args.prefix.as_deref().map(|p| p.trim_end_matches('/'));
    let app = match prefix {
        Some(p) if !p.is_empty() => {
            if !p.starts_with('/') {
                return Err(Failure::new(EXIT_USAGE, "--prefix must start with /"));
            }
            axum::Router::new().nest(p, dashboard.router())
        }
        _ => dashboard.router(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::new(EXIT_OTHER, format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(EXIT_OTHER, e.to_string()))?;
    println!(
        "taskq web: serving the dashboard at http://{addr}{}{}",
        prefix.unwrap_or(""),
        if prefix.is_some_and(|p| !p.is_empty()) {
            ""
        } else {
            "/"
        }
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| Failure::new(EXIT_OTHER, format!("server error: {e}")))?;
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
