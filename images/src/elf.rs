//! Just enough ELF64 reading to check what a third-party VMM needs from a
//! built-in image: the PVH entry note (`XEN_ELFNOTE_PHYS32_ENTRY`, type 18,
//! owner `Xen`) that Cloud Hypervisor (`--kernel`) and QEMU (`-kernel`) look
//! for in the `PT_NOTE` segments, and the loadable segment holding it.

/// ELF note type of the 32-bit PVH entry point.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// Program header type of a loadable segment.
pub const PT_LOAD: u32 = 1;
/// Program header type of a note segment.
pub const PT_NOTE: u32 = 4;
/// Program header flag: executable.
pub const PF_X: u32 = 1;

/// Why an image is not a PVH-bootable ELF.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    /// Not a little-endian ELF64 x86_64 executable.
    #[error("not a little-endian 64-bit x86_64 ELF executable")]
    NotElf64,
    /// A header, program header or note lies outside the file.
    #[error("{0} lies outside the file")]
    Truncated(&'static str),
    /// No `Xen` note of type 18 in any `PT_NOTE` segment.
    #[error("no PVH entry note (Xen, type 18)")]
    NoPvhNote,
    /// The note's descriptor is not a 4- or 8-byte address.
    #[error("the PVH note's descriptor has {0} bytes (4 or 8 expected)")]
    BadNoteSize(u32),
    /// The PVH entry is not inside an executable `PT_LOAD` segment, or above
    /// 4 GiB (it is entered in 32-bit mode).
    #[error("the PVH entry {0:#x} is not in an executable loadable segment below 4 GiB")]
    EntryNotLoaded(u64),
}

/// One program header (the fields used here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// `p_type`.
    pub kind: u32,
    /// `p_flags`.
    pub flags: u32,
    /// `p_offset`: where the segment's bytes start in the file.
    pub offset: u64,
    /// `p_paddr`: guest physical load address.
    pub paddr: u64,
    /// `p_filesz`.
    pub file_size: u64,
    /// `p_memsz`.
    pub mem_size: u64,
}

fn bytes<'a>(elf: &'a [u8], off: u64, len: u64, what: &'static str) -> Result<&'a [u8], ElfError> {
    let start = usize::try_from(off).map_err(|_| ElfError::Truncated(what))?;
    let len = usize::try_from(len).map_err(|_| ElfError::Truncated(what))?;
    let end = start.checked_add(len).ok_or(ElfError::Truncated(what))?;
    elf.get(start..end).ok_or(ElfError::Truncated(what))
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// The ELF entry point (`e_entry`: hqdmux's own VMM enters here in long mode).
pub fn entry(elf: &[u8]) -> Result<u64, ElfError> {
    let h = header(elf)?;
    Ok(u64_at(h, 24))
}

fn header(elf: &[u8]) -> Result<&[u8], ElfError> {
    let h = elf.get(..64).ok_or(ElfError::NotElf64)?;
    // Magic, ELFCLASS64, little-endian, ET_EXEC, EM_X86_64.
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 || u16_at(h, 16) != 2 || u16_at(h, 18) != 62
    {
        return Err(ElfError::NotElf64);
    }
    Ok(h)
}

/// The program headers.
pub fn segments(elf: &[u8]) -> Result<Vec<Segment>, ElfError> {
    let h = header(elf)?;
    let phoff = u64_at(h, 32);
    let phentsize = u64::from(u16_at(h, 54));
    let phnum = u64::from(u16_at(h, 56));
    if phentsize < 56 {
        return Err(ElfError::NotElf64);
    }
    (0..phnum)
        .map(|i| {
            let off = i
                .checked_mul(phentsize)
                .and_then(|o| o.checked_add(phoff))
                .ok_or(ElfError::Truncated("a program header"))?;
            let p = bytes(elf, off, 56, "a program header")?;
            Ok(Segment {
                kind: u32_at(p, 0),
                flags: u32_at(p, 4),
                offset: u64_at(p, 8),
                paddr: u64_at(p, 24),
                file_size: u64_at(p, 32),
                mem_size: u64_at(p, 40),
            })
        })
        .collect()
}

/// The PVH entry point from the image's `Xen` note of type 18, checked to lie
/// in an executable loadable segment below 4 GiB.
pub fn pvh_entry(elf: &[u8]) -> Result<u64, ElfError> {
    let segs = segments(elf)?;
    let mut found = None;
    'segs: for s in segs.iter().filter(|s| s.kind == PT_NOTE) {
        let notes = bytes(elf, s.offset, s.file_size, "a note segment")?;
        let mut o = 0usize;
        while o + 12 <= notes.len() {
            let namesz = u32_at(notes, o) as usize;
            let descsz = u32_at(notes, o + 4);
            let kind = u32_at(notes, o + 8);
            let name_at = o + 12;
            let desc_at = name_at
                .checked_add(namesz.next_multiple_of(4))
                .ok_or(ElfError::Truncated("a note"))?;
            let next = desc_at
                .checked_add((descsz as usize).next_multiple_of(4))
                .ok_or(ElfError::Truncated("a note"))?;
            if next > notes.len() {
                return Err(ElfError::Truncated("a note"));
            }
            if notes[name_at..name_at + namesz] == *b"Xen\0" && kind == XEN_ELFNOTE_PHYS32_ENTRY {
                let d = &notes[desc_at..desc_at + descsz as usize];
                found = Some(match descsz {
                    4 => u64::from(u32_at(d, 0)),
                    8 => u64_at(d, 0),
                    n => return Err(ElfError::BadNoteSize(n)),
                });
                break 'segs;
            }
            o = next;
        }
    }
    let at = found.ok_or(ElfError::NoPvhNote)?;
    let loaded = segs.iter().any(|s| {
        s.kind == PT_LOAD
            && s.flags & PF_X != 0
            && s.paddr <= at
            && at < s.paddr.saturating_add(s.file_size)
    });
    if !loaded || at >= 1 << 32 {
        return Err(ElfError::EntryNotLoaded(at));
    }
    Ok(at)
}

/// The file bytes loaded at guest physical `addr` (up to `len`), if a
/// `PT_LOAD` segment holds them.
pub fn bytes_at(elf: &[u8], addr: u64, len: usize) -> Option<&[u8]> {
    let s = segments(elf).ok()?.into_iter().find(|s| {
        s.kind == PT_LOAD && s.paddr <= addr && addr < s.paddr.saturating_add(s.file_size)
    })?;
    let off = s.offset.checked_add(addr - s.paddr)?;
    let avail = s.paddr + s.file_size - addr;
    bytes(elf, off, avail.min(len as u64), "").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_image_has_a_pvh_entry_apart_from_its_64_bit_entry() {
        for name in crate::names() {
            let elf = crate::builtin(name).unwrap();
            let pvh = pvh_entry(elf).unwrap_or_else(|e| panic!("{name}: {e}"));
            let entry = entry(elf).unwrap();
            assert_eq!(entry, 0x10_0000, "{name}: own-VMM entry at 1 MiB");
            assert_ne!(pvh, entry, "{name}: the PVH entry is the 32-bit stub");
            assert!(pvh >= 0x10_0000, "{name}: PVH entry inside the image");
            // The 32-bit stub starts with `cli` (0xFA) and `cld` (0xFC).
            assert_eq!(bytes_at(elf, pvh, 2), Some(&[0xFA, 0xFC][..]), "{name}");
        }
    }

    /// A minimal ELF64 header with `phnum` program headers right after it.
    fn elf_with(phdrs: &[[u8; 56]], tail: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[16] = 2;
        e[18] = 62;
        e[24..32].copy_from_slice(&0x10_0000u64.to_le_bytes());
        e[32..40].copy_from_slice(&64u64.to_le_bytes());
        e[54] = 56;
        e[56] = phdrs.len() as u8;
        for p in phdrs {
            e.extend_from_slice(p);
        }
        e.extend_from_slice(tail);
        e
    }

    fn phdr(kind: u32, flags: u32, offset: u64, paddr: u64, size: u64) -> [u8; 56] {
        let mut p = [0u8; 56];
        p[0..4].copy_from_slice(&kind.to_le_bytes());
        p[4..8].copy_from_slice(&flags.to_le_bytes());
        p[8..16].copy_from_slice(&offset.to_le_bytes());
        p[24..32].copy_from_slice(&paddr.to_le_bytes());
        p[32..40].copy_from_slice(&size.to_le_bytes());
        p[40..48].copy_from_slice(&size.to_le_bytes());
        p
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().next_multiple_of(4), 0);
        n.extend_from_slice(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    #[test]
    fn a_note_of_another_owner_or_type_is_not_a_pvh_entry() {
        let data = 64 + 2 * 56;
        for (name, kind) in [(&b"Xen\0"[..], 17), (&b"GNU\0"[..], 18)] {
            let n = note(name, kind, &0x10_0010u64.to_le_bytes());
            let e = elf_with(
                &[
                    phdr(PT_LOAD, PF_X, data as u64, 0x10_0000, 64),
                    phdr(PT_NOTE, 0, data as u64, 0x10_0000, n.len() as u64),
                ],
                &[n.clone(), vec![0; 64]].concat(),
            );
            assert_eq!(pvh_entry(&e), Err(ElfError::NoPvhNote));
        }
    }

    #[test]
    fn the_entry_must_be_loaded_executable_and_the_note_well_formed() {
        let data = (64 + 2 * 56) as u64;
        let n = note(b"Xen\0", 18, &0x10_0010u32.to_le_bytes());
        let tail = [n.clone(), vec![0; 64]].concat();
        let ok = elf_with(
            &[
                phdr(PT_LOAD, PF_X, data, 0x10_0000, 64),
                phdr(PT_NOTE, 0, data, 0x10_0000, n.len() as u64),
            ],
            &tail,
        );
        assert_eq!(pvh_entry(&ok), Ok(0x10_0010));
        let not_exec = elf_with(
            &[
                phdr(PT_LOAD, 0, data, 0x10_0000, 64),
                phdr(PT_NOTE, 0, data, 0x10_0000, n.len() as u64),
            ],
            &tail,
        );
        assert_eq!(
            pvh_entry(&not_exec),
            Err(ElfError::EntryNotLoaded(0x10_0010))
        );
        let past_end = elf_with(
            &[
                phdr(PT_LOAD, PF_X, data, 0x10_0000, 64),
                phdr(PT_NOTE, 0, data, 0x10_0000, 4096),
            ],
            &tail,
        );
        assert_eq!(
            pvh_entry(&past_end),
            Err(ElfError::Truncated("a note segment"))
        );
        let mut big = n.clone();
        big[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let huge_desc = elf_with(
            &[
                phdr(PT_LOAD, PF_X, data, 0x10_0000, 64),
                phdr(PT_NOTE, 0, data, 0x10_0000, big.len() as u64),
            ],
            &[big, vec![0; 64]].concat(),
        );
        assert_eq!(pvh_entry(&huge_desc), Err(ElfError::Truncated("a note")));
        let odd = note(b"Xen\0", 18, &[1, 2]);
        let odd_desc = elf_with(
            &[
                phdr(PT_LOAD, PF_X, data, 0x10_0000, 64),
                phdr(PT_NOTE, 0, data, 0x10_0000, odd.len() as u64),
            ],
            &[odd, vec![0; 64]].concat(),
        );
        assert_eq!(pvh_entry(&odd_desc), Err(ElfError::BadNoteSize(2)));
        assert_eq!(pvh_entry(b"not an elf"), Err(ElfError::NotElf64));
    }
}
