//! Empty library target: the loader's build-dependency on this crate makes cargo
//! rebuild the loader when the programs change (aya-template's arrangement).
#![no_std]
