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
    if let Some(path) = &args.token_file {
        let token = std::fs::read_to_string(path).map_err(|e| {
            Failure::new(
                EXIT_USAGE,
                format!("cannot read --token-file {}: {e}", path.display()),
            )
        })?;
        builder = builder.bearer_token(token.trim_end_matches(['\r', '\n']));
    }
    if let Some(path) = &args.session_secret_file {
        let secret = std::fs::read(path).map_err(|e| {
            Failure::new(
                EXIT_USAGE,
                format!("cannot read --session-secret-file {}: {e}", path.display()),
            )
        })?;
        builder = builder.session_secret(secret);
    }
    if let Some(basic) = &args.basic {
        let Some((user, password)) = basic.split_once(':') else {
            return Err(Failure::new(EXIT_USAGE, "--basic takes USER:PASSWORD"));
        };
        builder = builder.basic_auth(user, password);
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::new(EXIT_OTHER, format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(EXIT_OTHER, e.to_string()))?;
    let loopback = addr.ip().is_loopback();
    if args.insecure_no_auth {
        if !loopback && !args.allow_public_no_auth {
            return Err(Failure::new(
                EXIT_USAGE,
                format!(
                    "--insecure-no-auth on {}, which is not a loopback address, would let anyone who reaches it change tasks: listen on 127.0.0.1, set credentials, or add --allow-public-no-auth",
                    addr
                ),
            ));
        }
        builder = builder.insecure_no_auth();
    }
    match allowed_hosts(args, addr) {
        Some(hosts) => builder = builder.allowed_hosts(hosts),
        None if args.insecure_no_auth && !loopback => {
            return Err(Failure::new(
                EXIT_USAGE,
                "--insecure-no-auth on every interface needs --allowed-host: the names the dashboard answers",
            ));
        }
        None => {}
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
    println!(
        "taskq web: serving the dashboard at http://{addr}{}{}",
        prefix.unwrap_or(""),
        if prefix.is_some_and(|p| !p.is_empty()) {
            ""
        } else {
            "/"
        }
    );
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| Failure::new(EXIT_OTHER, format!("server error: {e}")))?;
    Ok(())
}

/// The Host names to answer: `--allowed-host`, or the `--listen` address (with `localhost`
/// for a loopback one); `None` (any name, or the library's default) when listening on every
/// interface.
fn allowed_hosts(args: &WebArgs, addr: std::net::SocketAddr) -> Option<Vec<String>> {
    if !args.allowed_hosts.is_empty() {
        return Some(args.allowed_hosts.clone());
    }
    let (ip, port) = (addr.ip(), addr.port());
    if ip.is_unspecified() {
        return None;
    }
    let own = addr.to_string();
    if ip.is_loopback() {
        Some(vec![
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
            own,
        ])
    } else {
        Some(vec![own])
    }
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
