//! Runs a loopback API server until killed, printing its URL (for trying it with kubectl by hand).

#![forbid(unsafe_code)]

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let server = k8s_loopback::Loopback::start().await?;
    println!("{}", server.url());
    std::future::pending::<()>().await;
    Ok(())
}
