// probe/src/elf_symbols.h: what the Recorder names a trace's native frames with at close.
// ElfSymbols: function names from an ELF file's full symbol table. Reads the file's section headers
// and its .symtab (.dynsym where a stripped file has no .symtab) with pread: no mapping, nothing kept
// open. No DWARF: names, not lines. It names what dladdr names (a module's exported functions) and
// what dladdr cannot (a program's own functions, exported only under -rdynamic, and every static one).
// LoadedModules: which loaded object holds an address, where it begins and its name, as dladdr says,
// from one dl_iterate_phdr listing. dladdr is not used per frame: glibc's scans the object's whole
// dynamic symbol table on each call (0.3 s of CPU at the close of an HF Trainer run: ~1000 frames in
// libtorch_cpu, 35 000 symbols); a table read once and searched by halves costs milliseconds.
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
    bool global = false;  // of two names at one address, find() gives the exported one, as dladdr
  };
  std::vector<Sym> syms_;  // sorted by start
  std::string strtab_;
  bool position_independent_ = false;
  uint64_t first_load_ = 0;
};

// The objects mapped at one moment (snapshot()): the executable, its libraries, the vDSO. An
// address between two objects' segments, or in memory no object maps (JIT code), is in none.
class LoadedModules {
 public:
  struct Module {
    std::string name;   // as dladdr's dli_fname, but "" for the program itself (dladdr: argv[0])
    uint64_t base = 0;  // as dladdr's dli_fbase: where the object's first loaded segment begins
  };
  // Lists the loaded objects now (the loader's lock is held only while listing).
  void snapshot();
  // The object one of whose loaded segments holds addr, or nullptr.
  const Module* find(uint64_t addr) const;
  size_t size() const { return modules_.size(); }

 private:
  struct Segment {
    uint64_t lo = 0, hi = 0;  // [lo, hi)
    size_t module = 0;
  };
  std::vector<Module> modules_;
  std::vector<Segment> segments_;  // sorted by lo
};

}  // namespace zt::probe
