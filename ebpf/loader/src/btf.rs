//! Struct member offsets from the running kernel's BTF, through libbpf.
//!
//! Rust eBPF has no CO-RE relocations, so the few kernel struct fields the
//! programs read are located here at load time and patched into the object.

use std::ffi::{CStr, CString};

use crate::error::Error;

const BTF_KIND_STRUCT: u32 = 4;
const BTF_KIND_UNION: u32 = 5;

/// The kernel's BTF (`/sys/kernel/btf/vmlinux`).
#[derive(Debug)]
pub struct KernelBtf {
    btf: *mut libbpf_sys::btf,
}

// SAFETY: the handle is only read after construction, and libbpf's read-only BTF
// queries do not touch global state.
unsafe impl Send for KernelBtf {}

impl KernelBtf {
    /// Loads the running kernel's BTF.
    ///
    /// # Errors
    /// [`Error::Btf`] if the kernel has none or it cannot be parsed.
    pub fn load() -> Result<Self, Error> {
        // SAFETY: no preconditions; returns NULL (errno set) on failure.
        let btf = unsafe { libbpf_sys::btf__load_vmlinux_btf() };
        if btf.is_null() {
            let err = std::io::Error::last_os_error();
            return Err(Error::Btf(format!("btf__load_vmlinux_btf: {err}")));
        }
        Ok(Self { btf })
    }

    /// Byte offset of `member` in `struct structure`, looking into anonymous
    /// struct/union members too.
    ///
    /// # Errors
    /// [`Error::BtfMember`] if there is no such member (or it is a bitfield).
    pub fn member_offset(
        &self,
        structure: &'static str,
        member: &'static str,
    ) -> Result<u32, Error> {
        let missing = || Error::BtfMember { structure, member };
        let name = CString::new(structure).map_err(|_| missing())?;
        // SAFETY: `self.btf` is valid; `name` is NUL-terminated.
        let id =
            unsafe { libbpf_sys::btf__find_by_name_kind(self.btf, name.as_ptr(), BTF_KIND_STRUCT) };
        if id < 0 {
            return Err(missing());
        }
        let bits = self.find(id as u32, member, 0).ok_or_else(missing)?;
        if bits % 8 != 0 {
            return Err(missing());
        }
        Ok(bits / 8)
    }

    /// Size in bytes of `struct structure`.
    ///
    /// # Errors
    /// [`Error::BtfMember`] (member `sizeof`) if there is no such struct.
    pub fn struct_size(&self, structure: &'static str) -> Result<u32, Error> {
        let missing = || Error::BtfMember {
            structure,
            member: "sizeof",
        };
        let name = CString::new(structure).map_err(|_| missing())?;
        // SAFETY: `self.btf` is valid; `name` is NUL-terminated.
        let id =
            unsafe { libbpf_sys::btf__find_by_name_kind(self.btf, name.as_ptr(), BTF_KIND_STRUCT) };
        if id < 0 {
            return Err(missing());
        }
        // SAFETY: `self.btf` is valid and `id` came from it.
        let size = unsafe { libbpf_sys::btf__resolve_size(self.btf, id as u32) };
        u32::try_from(size).map_err(|_| missing())
    }

    /// Bit offset of `member` inside type `id` (a struct or union), recursing into
    /// anonymous members.
    fn find(&self, id: u32, member: &str, base_bits: u32) -> Option<u32> {
        // SAFETY: `self.btf` is valid; the id comes from libbpf.
        let t = unsafe { libbpf_sys::btf__type_by_id(self.btf, id) };
        if t.is_null() {
            return None;
        }
        // SAFETY: non-null pointer into libbpf's parsed BTF.
        let t = unsafe { &*t };
        let kind = (t.info >> 24) & 0x1f;
        if kind != BTF_KIND_STRUCT && kind != BTF_KIND_UNION {
            return None;
        }
        let kflag = t.info >> 31 == 1;
        let vlen = (t.info & 0xffff) as usize;
        // SAFETY: BTF lays out `vlen` btf_member records right after a struct/union's btf_type.
        let members = unsafe {
            std::slice::from_raw_parts(
                (t as *const libbpf_sys::btf_type)
                    .add(1)
                    .cast::<libbpf_sys::btf_member>(),
                vlen,
            )
        };
        for m in members {
            let bits = if kflag {
                m.offset & 0x00ff_ffff
            } else {
                m.offset
            };
            // SAFETY: name offsets come from the same BTF.
            let name = unsafe { libbpf_sys::btf__name_by_offset(self.btf, m.name_off) };
            let name = if name.is_null() {
                ""
            } else {
                // SAFETY: libbpf returns NUL-terminated strings inside the BTF string section.
                unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("")
            };
            if name == member {
                return Some(base_bits + bits);
            }
            if name.is_empty() {
                // SAFETY: as above.
                let inner = unsafe { libbpf_sys::btf__resolve_type(self.btf, m.type_) };
                if inner >= 0
                    && let Some(found) = self.find(inner as u32, member, base_bits + bits)
                {
                    return Some(found);
                }
            }
        }
        None
    }
}

impl Drop for KernelBtf {
    fn drop(&mut self) {
        // SAFETY: `btf` came from btf__load_vmlinux_btf and is freed once.
        unsafe { libbpf_sys::btf__free(self.btf) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_struct_members_are_found_in_the_host_kernel() {
        if !evlet_testkit::require(
            "task_struct_members_are_found_in_the_host_kernel",
            std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            "the host kernel has no BTF",
        ) {
            return;
        }
        let btf = KernelBtf::load().expect("host BTF loads");
        let pid = btf.member_offset("task_struct", "pid").expect("pid");
        let tgid = btf.member_offset("task_struct", "tgid").expect("tgid");
        assert_eq!(
            tgid,
            pid + 4,
            "pid_t pid; pid_t tgid; are adjacent in every kernel"
        );
        assert!(btf.member_offset("signal_struct", "live").is_ok());
        assert!(btf.member_offset("pid", "numbers").is_ok());
        assert_eq!(
            btf.struct_size("upid").expect("upid"),
            16,
            "int nr; struct pid_namespace *ns;"
        );
        assert!(matches!(
            btf.member_offset("task_struct", "no_such_member"),
            Err(Error::BtfMember { .. })
        ));
    }
}
