//! `xroce devinfo`: what `ibv_devinfo -v` shows, for the xroce device on an interface.
use std::fmt::Write as _;

use xroce::netdev::{self, NetdevInfo};
use xroce::verbs::attr::{format_guid, DeviceAttr, PortAttr};

/// Show the RDMA device xroce would make of a network interface (like `ibv_devinfo -v`).
///
/// Examples:
///   xroce devinfo                 every Ethernet interface
///   xroce devinfo -d veth0 -v     one interface, with limits and the GID table
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Network interface, or the device name xroce_<IFACE>; default: all Ethernet ones.
    #[arg(short = 'd', long = "ib-dev", value_name = "IFACE")]
    pub device: Option<String>,
    /// Also print the device limits and the GID table.
    #[arg(short, long)]
    pub verbose: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let names = match &args.device {
        // The device name it prints (xroce_<iface>) is accepted as well as the interface.
        Some(name) => vec![xroce_tools::setup::interface_name(name)],
        None => {
            let mut names = Vec::new();
            for name in netdev::list()? {
                let info = netdev::query(&name)?;
                if info.link_type == "ether" {
                    names.push(name);
                }
            }
            if names.is_empty() {
                println!("No Ethernet interfaces found (xroce devices sit on Ethernet links).");
                return Ok(1);
            }
            names
        }
    };
    for name in names {
        let info = netdev::query(&name)?;
        print!("{}", render(&info, args.verbose));
    }
    Ok(0)
}

/// The `ibv_devinfo`-style text for one interface.
pub fn render(net: &NetdevInfo, verbose: bool) -> String {
    let dev = DeviceAttr::for_netdev(net);
    let port = PortAttr::for_netdev(net);
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "hca_id:\txroce_{}", net.name);
    let _ = writeln!(w, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(w, "\tfw_ver:\t\t\t\t{}", dev.fw_ver);
    let _ = writeln!(w, "\tnode_guid:\t\t\t{}", format_guid(dev.node_guid));
    let _ = writeln!(
        w,
        "\tsys_image_guid:\t\t\t{}",
        format_guid(dev.sys_image_guid)
    );
    let _ = writeln!(w, "\tvendor_id:\t\t\t0x{:04x}", dev.vendor_id);
    let _ = writeln!(w, "\tvendor_part_id:\t\t\t{}", dev.vendor_part_id);
    let _ = writeln!(w, "\thw_ver:\t\t\t\t0x{:x}", dev.hw_ver);
    let _ = writeln!(w, "\tphys_port_cnt:\t\t\t{}", dev.phys_port_cnt);
    let _ = writeln!(
        w,
        "\tnetdev:\t\t\t\t{} (ifindex {}, mac {}, driver {}, {} rx queue(s))",
        net.name,
        net.ifindex,
        net.mac,
        net.driver.as_deref().unwrap_or("unknown"),
        net.num_rx_queues.unwrap_or(1)
    );
    let xdp = match &net.xdp {
        Some(x) => format!(
            "{} mode, program id {}",
            x.mode,
            x.prog_ids
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        None => "none attached (xroce attaches its own while a device is open)".to_string(),
    };
    let _ = writeln!(w, "\txdp:\t\t\t\t{xdp}");
    let xdp_driver = if cfg!(feature = "xdp") {
        "xdp (AF_XDP, needs root)"
    } else {
        "xdp (not in this build: no `xdp` feature)"
    };
    let _ = writeln!(
        w,
        "\txroce drivers:\t\t\t{xdp_driver}, udp (kernel socket on port 4791), mem"
    );
    if verbose {
        let _ = writeln!(w, "\tmax_mr_size:\t\t\t0x{:x}", dev.max_mr_size);
        let _ = writeln!(w, "\tpage_size_cap:\t\t\t0x{:x}", dev.page_size_cap);
        let _ = writeln!(w, "\tmax_qp:\t\t\t\t{}", dev.max_qp);
        let _ = writeln!(w, "\tmax_qp_wr:\t\t\t{}", dev.max_qp_wr);
        let _ = writeln!(w, "\tmax_sge:\t\t\t{}", dev.max_sge);
        let _ = writeln!(w, "\tmax_cq:\t\t\t\t{}", dev.max_cq);
        let _ = writeln!(w, "\tmax_cqe:\t\t\t{}", dev.max_cqe);
        let _ = writeln!(w, "\tmax_mr:\t\t\t\t{}", dev.max_mr);
        let _ = writeln!(w, "\tmax_pd:\t\t\t\t{}", dev.max_pd);
        let _ = writeln!(w, "\tmax_qp_rd_atom:\t\t\t{}", dev.max_qp_rd_atom);
        let _ = writeln!(w, "\tmax_qp_init_rd_atom:\t\t{}", dev.max_qp_init_rd_atom);
        let _ = writeln!(w, "\tmax_inline_data:\t\t{}", dev.max_inline_data);
        let _ = writeln!(w, "\tmax_ah:\t\t\t\t{}", dev.max_ah);
        let _ = writeln!(w, "\tmax_srq:\t\t\t{}", dev.max_srq);
        let _ = writeln!(w, "\tmax_srq_wr:\t\t\t{}", dev.max_srq_wr);
        let _ = writeln!(w, "\tmax_srq_sge:\t\t\t{}", dev.max_srq_sge);
        let _ = writeln!(w, "\tmax_mw:\t\t\t\t{}", dev.max_mw);
        let _ = writeln!(
            w,
            "\tatomic_cap:\t\t\t{} ({})",
            dev.atomic_cap.name(),
            dev.atomic_cap as u8
        );
    }
    let _ = writeln!(w, "\t\tport:\t1");
    let _ = writeln!(
        w,
        "\t\t\tstate:\t\t\t{} ({})",
        port.state.name(),
        port.state as u8
    );
    let _ = writeln!(
        w,
        "\t\t\tmax_mtu:\t\t{} ({})",
        port.max_mtu.bytes(),
        port.max_mtu as u8
    );
    let _ = writeln!(
        w,
        "\t\t\tactive_mtu:\t\t{} ({})\t(link MTU {} - 80 bytes of RoCE headers)",
        port.active_mtu.bytes(),
        port.active_mtu as u8,
        port.link_mtu
    );
    let _ = writeln!(w, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(w, "\t\t\tport_lid:\t\t0");
    let _ = writeln!(w, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(w, "\t\t\tlink_layer:\t\tEthernet");
    if verbose {
        let _ = writeln!(w, "\t\t\tmax_msg_sz:\t\t0x{:x}", port.max_msg_sz);
        let _ = writeln!(w, "\t\t\tgid_tbl_len:\t\t{}", port.gid_tbl_len);
        let _ = writeln!(w, "\t\t\tpkey_tbl_len:\t\t{}", port.pkey_tbl_len);
        for entry in net.gid_table() {
            let raw = entry.gid.to_hex();
            let groups: Vec<&str> = (0..8).map(|i| &raw[4 * i..4 * i + 4]).collect();
            let _ = writeln!(
                w,
                "\t\t\tGID[{:>3}]:\t\t{}, {}\t({})",
                entry.index,
                groups.join(":"),
                entry.gid_type,
                entry.gid.to_ip()
            );
        }
    }
    let _ = writeln!(w);
    out
}
