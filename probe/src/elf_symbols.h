// probe/src/elf_symbols.h: function names from an ELF file's full symbol table, for the stack
// frames dladdr cannot name. dladdr sees a module's dynamic symbols only, so a program's own
// functions (exported only under -rdynamic) and every static function came out nameless.
// Reads the file's section headers and its .symtab (.dynsym where a stripped file has no
// .symtab) with pread: no mapping, nothing kept open. No DWARF: names, not lines.
// May call: libc only. Used by the Recorder when it symbolizes a trace's frames at close.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zt::probe {

class ElfSymbols {
 public:
  // Reads the function symbols of `path`; false (and nothing found later) when it is not a
  // readable 64-bit ELF file or has no symbol table.
  bool load(const std::string& path);
  // The function that contains `addr` (an address as the file's symbols count them: for a
  // position-independent file, the offset from its load base), or nullptr.
  const char* find(uint64_t addr) const;
  // ET_DYN (a shared library or a PIE program): symbol values are offsets from the load base.
  bool position_independent() const { return position_independent_; }
  // The lowest PT_LOAD address, page-aligned down: where the first loaded segment begins in the
  // file's own addresses (0 but for prelinked libraries or -Ttext-segment), so an address found
  // at `dladdr`'s dli_fbase + k is first_load_address() + k in the symbol table's terms.
  uint64_t first_load_address() const { return first_load_; }
  size_t size() const { return syms_.size(); }

 private:
  struct Sym {
    uint64_t start = 0, size = 0;
    uint32_t name = 0;  // offset in strtab_
  };
  std::vector<Sym> syms_;  // sorted by start
  std::string strtab_;
  bool position_independent_ = false;
  uint64_t first_load_ = 0;
};

}  // namespace zt::probe
