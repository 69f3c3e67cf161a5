//! `cairn cert`: the cluster CA and the certificates of its servers, clients and admins
//! (mutual TLS, `net/src/tls.rs`).

use std::path::{Path, PathBuf};

use cairn_common::Result;
use cairn_net::tls::{self, CertInfo, Role, Subject};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum CertCommand {
    /// Make a cluster CA in DIR (`ca.pem`, and `ca.key`, which signs every certificate: keep it
    /// off the servers). Refuses to replace one.
    Init {
        dir: PathBuf,
        /// How long the CA is valid, days.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a certificate into the TLS directory OUT (`ca.pem`, `cert.pem`, `key.pem`), for a
    /// server, a mount or an admin; issuing again into OUT rotates it (running processes pick
    /// it up on SIGHUP or within a minute).
    Issue {
        out: PathBuf,
        /// The CA directory (`cairn cert init`).
        #[arg(long)]
        ca: PathBuf,
        /// What the holder may do: meta, chunk, client or admin (comma-separated for several).
        #[arg(long, value_delimiter = ',', value_parser = parse_role, required = true)]
        role: Vec<Role>,
        /// The holder's name (host or user), shown in logs and refusals.
        #[arg(long)]
        name: String,
        /// Extra DNS names or IP addresses (for other tools; Cairn checks roles, not addresses).
        #[arg(long = "san", value_name = "NAME_OR_IP")]
        sans: Vec<String>,
        /// How long it is valid, days.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
    /// What the certificate in a TLS directory (or a CA directory) says: name, roles, names,
    /// validity.
    Show { dir: PathBuf },
    /// Every certificate of a cluster under DIR, as `cairn up` makes them: a CA (`ca/`), one
    /// TLS directory per metaserver (`meta-N/`) and chunkserver (`chunk-N/`), a mount's
    /// (`client/`) and an admin's (`admin/`). Only what is missing or expires within 30 days
    /// is made, so running it again is harmless (containers run it at every start).
    Cluster {
        dir: PathBuf,
        #[arg(long, default_value_t = 3)]
        metas: usize,
        #[arg(long, default_value_t = 6)]
        chunks: usize,
        /// Extra DNS names or IP addresses for every certificate.
        #[arg(long = "san", value_name = "NAME_OR_IP")]
        sans: Vec<String>,
    },
}

/// The certificates of a cluster under `root` (see [`CertCommand::Cluster`]).
pub fn cluster(root: &Path, metas: usize, chunks: usize, sans: &[String]) -> Result<()> {
    let ca = root.join("ca");
    if !ca.join(tls::CA_CERT).exists() {
        tls::make_ca(&ca, 3650)?;
    }
    let mut wanted: Vec<(String, Role)> =
        vec![("client".into(), Role::Client), ("admin".into(), Role::Admin)];
    wanted.extend((1..=metas).map(|i| (format!("meta-{i}"), Role::Meta)));
    wanted.extend((1..=chunks).map(|i| (format!("chunk-{i}"), Role::Chunk)));
    for (name, role) in wanted {
        let out = root.join(&name);
        // Kept only if signed by this CA (a CA made anew re-issues everything) and not about
        // to expire.
        let same_ca = std::fs::read(out.join(tls::CA_CERT)).ok() == std::fs::read(ca.join(tls::CA_CERT)).ok();
        let fresh = same_ca && tls::Identity::load(&out).is_ok_and(|id| id.cert.expires_in() > 30 * 86_400);
        if !fresh {
            let subject = Subject { name, roles: vec![role], alt_names: sans.to_vec(), days: 365 };
            tls::issue(&ca, &out, &subject)?;
        }
    }
    Ok(())
}

fn parse_role(s: &str) -> std::result::Result<Role, String> {
    Role::parse(s).map_err(|e| e.message().to_string())
}

pub fn run(cmd: CertCommand) -> Result<()> {
    match cmd {
        CertCommand::Init { dir, days } => {
            let info = tls::make_ca(&dir, days)?;
            println!(
                "cluster CA in {} (ca.pem, ca.key), valid until {}",
                dir.display(),
                tls::format_time(info.not_after)
            );
            println!("keep ca.key where only its administrators can read it; servers need ca.pem only");
        }
        CertCommand::Issue { out, ca, role, name, sans, days } => {
            let info = tls::issue(&ca, &out, &Subject { name, roles: role, alt_names: sans, days })?;
            println!("{}: {}", out.display(), summary(&info));
        }
        CertCommand::Cluster { dir, metas, chunks, sans } => {
            cluster(&dir, metas, chunks, &sans)?;
            println!(
                "{}: CA in ca/, identities meta-1..{metas}, chunk-1..{chunks}, client, admin",
                dir.display()
            );
        }
        CertCommand::Show { dir } => {
            let info = tls::describe(&dir)?;
            print_info(&dir, &info);
        }
    }
    Ok(())
}

fn summary(info: &CertInfo) -> String {
    format!("{:?} roles {} valid until {}", info.name, info.roles, tls::format_time(info.not_after))
}

fn print_info(dir: &Path, info: &CertInfo) {
    println!("{}", dir.display());
    println!("  name        {}", info.name);
    println!("  roles       {}", info.roles);
    println!("  names       {}", info.alt_names.join(", "));
    println!("  valid from  {}", tls::format_time(info.not_before));
    let days = info.expires_in() / 86_400;
    let left = if info.expires_in() < 0 { "EXPIRED".to_string() } else { format!("{days} days left") };
    println!("  valid until {} ({left})", tls::format_time(info.not_after));
}
