//! Parsing and validating the variable parts of replies: the VERSION reply's JSON capabilities
//! and a region's capability chain (sparse mmap areas).

use super::*;

/// Parses and validates a VERSION reply payload.
pub fn parse_version_reply(p: &[u8]) -> Result<VersionInfo> {
    let c = command::VERSION;
    let Some(Version { major, minor }) = Version::decode(p) else {
        return Err(proto(c, format!("payload {} bytes, need {}", p.len(), Version::SIZE)));
    };
    if major != 0 {
        return Err(proto(c, format!("major version {major}, proposed 0")));
    }
    if minor > 1 {
        return Err(proto(c, format!("minor version {minor} above the proposed 1")));
    }
    let mut info = VersionInfo {
        major,
        minor,
        json: String::new(),
        max_msg_fds: 1,
        max_data_xfer_size: DEFAULT_MAX_DATA_XFER as u64,
        pgsizes: 4096,
        unexpected_caps: Vec::new(),
    };
    let data = &p[Version::SIZE..];
    if data.is_empty() {
        return Ok(info);
    }
    let Some((&0, body)) = data.split_last() else {
        return Err(proto(c, "version data is not NUL-terminated"));
    };
    if body.contains(&0) {
        return Err(proto(c, "version data has an embedded NUL"));
    }
    let s = std::str::from_utf8(body).map_err(|_| proto(c, "version data is not UTF-8"))?;
    info.json = s.to_string();
    let v: serde_json::Value = serde_json::from_str(s).map_err(|e| proto(c, format!("version JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| proto(c, "version JSON is not an object"))?;
    let Some(caps) = obj.get("capabilities") else {
        return Ok(info);
    };
    let caps = caps.as_object().ok_or_else(|| proto(c, "\"capabilities\" is not an object"))?;
    for (k, val) in caps {
        let num =
            || val.as_u64().ok_or_else(|| proto(c, format!("capability {k} is not a non-negative integer")));
        match k.as_str() {
            "max_msg_fds" => info.max_msg_fds = num()?,
            "max_data_xfer_size" => info.max_data_xfer_size = num()?,
            "pgsizes" => info.pgsizes = num()?,
            other => info.unexpected_caps.push(other.to_string()),
        }
    }
    Ok(info)
}

/// Sparse areas and other (id, version) capabilities of a region.
pub type RegionCaps = (Vec<SparseArea>, Vec<(u16, u16)>);

/// Parses the capability chain of a region-info reply: returns sparse areas and other caps.
pub fn parse_region_caps(info: &RegionInfoRaw, payload: &[u8]) -> Result<RegionCaps> {
    let c = command::DEVICE_GET_REGION_INFO;
    let idx = info.index;
    let mut sparse = Vec::new();
    let mut other = Vec::new();
    let has_caps = info.flags & VFIO_REGION_INFO_FLAG_CAPS != 0;
    if !has_caps {
        if info.cap_offset != 0 {
            return Err(proto(c, format!("region {idx}: cap_offset without the CAPS flag")));
        }
        return Ok((sparse, other));
    }
    if payload.len() < info.argsz as usize {
        // Caps did not fit the argsz we offered; nothing to parse.
        return Ok((sparse, other));
    }
    let mut next = info.cap_offset as usize;
    if next == 0 {
        return Err(proto(c, format!("region {idx}: CAPS flag with cap_offset 0")));
    }
    let mut prev = 0usize;
    let mut seen_sparse = false;
    while next != 0 {
        if next < REGION_INFO_SIZE || next <= prev || next + CapHeader::SIZE > payload.len() {
            return Err(proto(
                c,
                format!("region {idx}: capability offset {next} out of bounds or not advancing"),
            ));
        }
        if !next.is_multiple_of(4) {
            return Err(proto(c, format!("region {idx}: capability offset {next} unaligned")));
        }
        let h = CapHeader::decode(&payload[next..]).expect("bounds checked");
        let body = &payload[next + CapHeader::SIZE..];
        if u32::from(h.id) == VFIO_REGION_INFO_CAP_SPARSE_MMAP {
            if seen_sparse {
                return Err(proto(c, format!("region {idx}: two sparse-mmap capabilities")));
            }
            seen_sparse = true;
            if h.version != 1 {
                return Err(proto(c, format!("region {idx}: sparse-mmap version {}", h.version)));
            }
            let Some(head) = SparseMmapHead::decode(body) else {
                return Err(proto(c, format!("region {idx}: truncated sparse-mmap capability")));
            };
            let nr = head.nr_areas as usize;
            let areas = &body[SparseMmapHead::SIZE..];
            if nr > areas.len() / SparseArea::SIZE {
                return Err(proto(c, format!("region {idx}: {nr} sparse areas do not fit the reply")));
            }
            if h.next != 0
                && (h.next as usize) < next + CapHeader::SIZE + SparseMmapHead::SIZE + nr * SparseArea::SIZE
            {
                return Err(proto(c, format!("region {idx}: next capability overlaps the areas")));
            }
            for i in 0..nr {
                let a = SparseArea::decode(&areas[i * SparseArea::SIZE..]).expect("bounds checked");
                let end = a.offset.checked_add(a.size);
                if a.size == 0 || end.is_none_or(|e| e > info.size) {
                    return Err(proto(
                        c,
                        format!(
                            "region {idx}: sparse area {:#x}+{:#x} outside the region (size {:#x})",
                            a.offset, a.size, info.size
                        ),
                    ));
                }
                sparse.push(a);
            }
        } else {
            other.push((h.id, h.version));
        }
        prev = next;
        next = h.next as usize;
    }
    Ok((sparse, other))
}
