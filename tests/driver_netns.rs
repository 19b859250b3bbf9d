//! The namespace harness: a veth link carries traffic and disappears when dropped.
mod common;

use xroce::netns::{add_named, ip, LinkConfig, Netns, VethLink};

fn namespace_exists(name: &str) -> bool {
    let out = ip(&["netns", "list"]).expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn veth_link_pings_both_ways_and_is_removed_on_drop() {
    if !common::privileged_or_skip("veth_link_pings_both_ways_and_is_removed_on_drop") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        mtu: 9000,
        ..LinkConfig::default()
    })
    .expect("create link");
    let names = (link.a.name().to_string(), link.b.name().to_string());
    assert!(namespace_exists(&names.0) && namespace_exists(&names.1));
    assert_ne!(link.a_mac, link.b_mac);
    let ping = |ns: &Netns, dst: String| {
        ns.command("ping")
            .args(["-c1", "-W2", "-s", "8000", &dst])
            .output()
            .expect("run ping")
    };
    let out = ping(&link.a, link.b_ip.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = ping(&link.b, link.a_ip6.unwrap().to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mtu = link
        .a
        .ip(&["-j", "link", "show", "dev", &link.a_if])
        .unwrap();
    assert!(String::from_utf8_lossy(&mtu.stdout).contains("\"mtu\":9000"));
    drop(link);
    assert!(!namespace_exists(&names.0), "namespace A left behind");
    assert!(!namespace_exists(&names.1), "namespace B left behind");
}

#[test]
fn namespaces_are_removed_after_a_panic() {
    if !common::privileged_or_skip("namespaces_are_removed_after_a_panic") {
        return;
    }
    let name = std::panic::catch_unwind(|| {
        let ns = Netns::create("panic").expect("create");
        let name = ns.name().to_string();
        assert!(namespace_exists(&name));
        std::panic::panic_any(name);
    })
    .expect_err("the closure panics");
    let name = name
        .downcast::<String>()
        .expect("panic payload is the name");
    assert!(!namespace_exists(&name), "{name} survived the panic");
}

#[test]
fn not_root_gets_a_clear_error() {
    if !common::privileged_or_skip("not_root_gets_a_clear_error") {
        return;
    }
    // Run the check as nobody, via the test binary's own helper mode.
    let out = std::process::Command::new("setpriv")
        .args(common::SETPRIV_AS_NOBODY)
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "netns_helper_create_as_current_user",
            "--nocapture",
        ])
        .env("XROCE_NETNS_HELPER", "1")
        .output()
        .expect("setpriv");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("needs root (CAP_SYS_ADMIN"), "{text}");
}

/// Not a test on its own: run by `not_root_gets_a_clear_error` as an unprivileged user.
#[test]
fn netns_helper_create_as_current_user() {
    if std::env::var("XROCE_NETNS_HELPER").is_err() {
        return;
    }
    match Netns::create("nobody") {
        Ok(_) => println!("HELPER-RESULT: created (unexpected)"),
        Err(e) => println!("HELPER-RESULT: {e}"),
    }
}

#[test]
fn namespaces_of_dead_processes_are_swept() {
    if !common::privileged_or_skip("namespaces_of_dead_processes_are_swept") {
        return;
    }
    // A pid that certainly is dead: a child we already reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("xroce-stale-p{dead}-0");
    // The other tests here sweep too, in parallel, and may remove it in the middle of its
    // `ip netns add` (add_named tries again) or right after it (also fine).
    if let Err(e) = add_named(&stale) {
        // Only acceptable if it is there already (left by an earlier run with that pid).
        assert!(namespace_exists(&stale), "ip netns add {stale}: {e}");
    }
    let fresh = Netns::create("sweep").unwrap();
    assert!(
        !namespace_exists(&stale),
        "stale namespace of pid {dead} not swept"
    );
    assert!(namespace_exists(fresh.name()), "our own namespace is kept");
}
