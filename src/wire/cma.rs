//! rdma_cm's conventions on top of the IBTA CM (not in the IBTA; the Linux kernel's cma.c
//! and librdmacm define them): service ids built from a port space and a port, and the
//! 36-byte header rdma_cm puts at the start of a REQ's or SIDR_REQ's private data so the
//! passive side learns the IP addresses and the active side's port.
//!
//! ```text
//! byte 0        1             2..4          4..20             20..36
//! +---------+-------------+-----------+----------------+----------------+
//! | version | IP ver << 4 | src port  | source address | dest. address  |
//! +---------+-------------+-----------+----------------+----------------+
//! ```
//! An IPv4 address takes the last 4 bytes of its 16 (the first 12 zero).
//! Service id (RoCE and IB alike): `port_space << 16 | port` (cma.c). The port-space codes
//! of TCP, UDP and IB start with 0x01, which puts those ids in the IBTA's IP-based CM range
//! `0x0000_0000_01PP_pppp` (protocol PP: 0x06 TCP, 0x11 UDP); IPoIB's 0x0002 does not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bytes::{get_u16, set_u16};
use super::mad::{check_mad_len, MadError, MadResult};

/// Length of rdma_cm's private-data header.
pub const CMA_HEADER_LEN: usize = 36;
/// The header version rdma_cm sends (cma.c: CMA_VERSION).
pub const CMA_VERSION: u8 = 0x00;

/// An rdma_cm port space: the middle 16 bits of the service id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// RDMA_PS_IPOIB (0x0002).
    Ipoib,
    /// RDMA_PS_TCP (0x0106): connected QPs (rping, ib_write_bw -R).
    Tcp,
    /// RDMA_PS_UDP (0x0111): UD QPs via SIDR (udaddy).
    Udp,
    /// RDMA_PS_IB (0x013F): either kind.
    Ib,
}

impl PortSpace {
    /// From the 16-bit code; `None` for a code rdma_cm does not define.
    pub const fn from_code(c: u16) -> Option<PortSpace> {
        match c {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            _ => None,
        }
    }
    /// The 16-bit code.
    pub const fn code(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
        }
    }
    /// Its name in librdmacm ("RDMA_PS_TCP").
    pub const fn name(self) -> &'static str {
        match self {
            PortSpace::Ipoib => "RDMA_PS_IPOIB",
            PortSpace::Tcp => "RDMA_PS_TCP",
            PortSpace::Udp => "RDMA_PS_UDP",
            PortSpace::Ib => "RDMA_PS_IB",
        }
    }
}

/// The service id rdma_cm listens on / connects to for a port in a port space.
pub const fn service_id(port_space: PortSpace, port: u16) -> u64 {
    (port_space.code() as u64) << 16 | port as u64
}

/// Splits an rdma_cm service id into port space and port; `None` if it is not one.
pub const fn split_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    match PortSpace::from_code((service_id >> 16) as u16) {
        Some(ps) => Some((ps, service_id as u16)),
        None => None,
    }
}

/// rdma_cm's private-data header as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// Header version (0).
    pub version: u8,
    /// The active side's port (its rdma_cm id's source port; the destination port is in the
    /// service id).
    pub src_port: u16,
    /// The active side's address.
    pub src_addr: IpAddr,
    /// The passive side's address.
    pub dst_addr: IpAddr,
}

impl CmaHeader {
    /// A version-0 header.
    pub const fn new(src_addr: IpAddr, src_port: u16, dst_addr: IpAddr) -> CmaHeader {
        CmaHeader {
            version: CMA_VERSION,
            src_port,
            src_addr,
            dst_addr,
        }
    }

    /// The IP version the header announces (4 or 6): 6 if either address is IPv6.
    pub const fn ip_version(&self) -> u8 {
        match (self.src_addr, self.dst_addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            _ => 6,
        }
    }

    /// Reads the header at the start of `private_data`.
    pub fn parse(private_data: &[u8]) -> MadResult<CmaHeader> {
        check_mad_len("rdma_cm header", CMA_HEADER_LEN, private_data.len())?;
        let b = private_data;
        if b[0] != CMA_VERSION {
            return Err(MadError::BadCmaVersion(b[0]));
        }
        let ip_version = b[1] >> 4;
        let addr = |at: usize| -> IpAddr {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            if ip_version == 4 {
                IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
            } else {
                IpAddr::V6(Ipv6Addr::from(a))
            }
        };
        if ip_version != 4 && ip_version != 6 {
            return Err(MadError::BadCmaIpVersion(ip_version));
        }
        Ok(CmaHeader {
            version: b[0],
            src_port: get_u16(b, 2),
            src_addr: addr(4),
            dst_addr: addr(20),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        CMA_HEADER_LEN
    }

    /// Writes the header into the first 36 bytes of `buf`. A mixed pair (one IPv4, one
    /// IPv6 address) is written as IPv6 with the IPv4 address mapped (`::ffff:a.b.c.d`).
    pub fn emit(&self, buf: &mut [u8]) -> MadResult<()> {
        check_mad_len("rdma_cm header buffer", CMA_HEADER_LEN, buf.len())?;
        let v = self.ip_version();
        let bytes = |a: IpAddr| -> [u8; 16] {
            match (a, v) {
                (IpAddr::V4(a4), 4) => {
                    let mut out = [0u8; 16];
                    out[12..].copy_from_slice(&a4.octets());
                    out
                }
                (IpAddr::V4(a4), _) => a4.to_ipv6_mapped().octets(),
                (IpAddr::V6(a6), _) => a6.octets(),
            }
        };
        buf[0] = self.version;
        buf[1] = v << 4;
        set_u16(buf, 2, self.src_port);
        buf[4..20].copy_from_slice(&bytes(self.src_addr));
        buf[20..36].copy_from_slice(&bytes(self.dst_addr));
        Ok(())
    }
}

impl CmaHeader {
    /// A REQ's or SIDR_REQ's private data: this header, then the user's `user_data` (at most
    /// `N - 36` bytes: 56 in a REQ, 180 in a SIDR_REQ), then zeros.
    pub fn private_data<const N: usize>(
        &self,
        user_data: &[u8],
    ) -> MadResult<super::cm::PrivateData<N>> {
        let room = N.saturating_sub(CMA_HEADER_LEN);
        if user_data.len() > room {
            return Err(MadError::PrivateDataTooLong {
                len: user_data.len(),
                max: room,
            });
        }
        let mut out = [0u8; N];
        check_mad_len("private data", CMA_HEADER_LEN, N)?;
        self.emit(&mut out[..CMA_HEADER_LEN])?;
        out[CMA_HEADER_LEN..CMA_HEADER_LEN + user_data.len()].copy_from_slice(user_data);
        Ok(super::cm::PrivateData(out))
    }

    /// The user's part of private data that starts with an rdma_cm header (zero padded to the
    /// message's size; rdma_cm hands all of it to the user).
    pub fn user_data(private_data: &[u8]) -> &[u8] {
        private_data.get(CMA_HEADER_LEN..).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_of_port_spaces() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id(PortSpace::Udp, 7174), 0x0000_0000_0111_1c06);
        assert_eq!(service_id(PortSpace::Ib, 1), 0x0000_0000_013F_0001);
        assert_eq!(service_id(PortSpace::Ipoib, 2), 0x0000_0000_0002_0002);
        for ps in [
            PortSpace::Ipoib,
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
        ] {
            assert_eq!(split_service_id(service_id(ps, 4791)), Some((ps, 4791)));
        }
        assert_eq!(split_service_id(0x0000_0001_0106_1c06), None);
        assert_eq!(split_service_id(0x0000_0000_0200_0001), None);
        assert_eq!(split_service_id(0x0000_0000_0107_0001), None);
    }

    #[test]
    fn header_round_trips_and_rejects_bad_versions() {
        let h = CmaHeader::new(
            "198.18.0.12".parse().unwrap(),
            40000,
            "198.18.0.11".parse().unwrap(),
        );
        let mut buf = [0xEEu8; 36];
        h.emit(&mut buf).unwrap();
        assert_eq!(&buf[..4], &[0, 0x40, 0x9c, 0x40]);
        assert_eq!(
            &buf[4..20],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 12]
        );
        assert_eq!(CmaHeader::parse(&buf).unwrap(), h);
        let mut v6 = h;
        v6.dst_addr = "2001:db8::1".parse().unwrap();
        v6.emit(&mut buf).unwrap();
        assert_eq!(buf[1], 0x60);
        let back = CmaHeader::parse(&buf).unwrap();
        assert_eq!(
            back.src_addr,
            "::ffff:198.18.0.12".parse::<IpAddr>().unwrap()
        );
        buf[1] = 0x50;
        assert_eq!(CmaHeader::parse(&buf), Err(MadError::BadCmaIpVersion(5)));
        buf[0] = 1;
        assert_eq!(CmaHeader::parse(&buf), Err(MadError::BadCmaVersion(1)));
        assert!(CmaHeader::parse(&buf[..35]).is_err());
    }

    #[test]
    fn private_data_is_the_header_then_the_users_bytes() {
        let h = CmaHeader::new(
            "198.18.0.12".parse().unwrap(),
            40909,
            "198.18.0.11".parse().unwrap(),
        );
        let pd = h.private_data::<92>(b"hello").unwrap();
        assert_eq!(CmaHeader::parse(pd.as_bytes()).unwrap(), h);
        assert_eq!(&CmaHeader::user_data(pd.as_bytes())[..6], b"hello\0");
        assert_eq!(CmaHeader::user_data(pd.as_bytes()).len(), 56);
        assert!(h.private_data::<92>(&[1; 56]).is_ok());
        assert_eq!(
            h.private_data::<92>(&[1; 57]),
            Err(MadError::PrivateDataTooLong { len: 57, max: 56 })
        );
        assert!(h.private_data::<20>(&[]).is_err());
        assert!(CmaHeader::user_data(&[0; 10]).is_empty());
    }
}
