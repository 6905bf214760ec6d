#include "elf_symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace zt::probe {
namespace {

// Reads exactly n bytes at `off`; false on a short file.
bool read_at(int fd, void* dst, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r <= 0) return false;
    p += r, n -= size_t(r), off += uint64_t(r);
  }
  return true;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool ElfSymbols::load(const std::string& path) {
  syms_.clear();
  strtab_.clear();
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return false;
  Elf64_Ehdr eh{};
  if (!read_at(f.fd, &eh, sizeof eh, 0) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||
      eh.e_shnum > 65000)
    return false;
  position_independent_ = eh.e_type == ET_DYN;
  first_load_ = 0;
  if (eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum > 0 && eh.e_phnum < 4096) {
    std::vector<Elf64_Phdr> ph(eh.e_phnum);
    if (read_at(f.fd, ph.data(), ph.size() * sizeof(Elf64_Phdr), eh.e_phoff)) {
      bool any = false;
      for (const auto& p : ph)
        if (p.p_type == PT_LOAD && (!any || p.p_vaddr < first_load_)) first_load_ = p.p_vaddr, any = true;
      const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
      first_load_ &= ~(page - 1);
    }
  }
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (!read_at(f.fd, sh.data(), sh.size() * sizeof(Elf64_Shdr), eh.e_shoff)) return false;
  const Elf64_Shdr* table = nullptr;
  for (const auto& s : sh)
    if (s.sh_type == SHT_SYMTAB) table = &s;
  if (!table)
    for (const auto& s : sh)
      if (s.sh_type == SHT_DYNSYM) table = &s;
  if (!table || table->sh_entsize != sizeof(Elf64_Sym) || table->sh_link >= sh.size()) return false;
  const Elf64_Shdr& strs = sh[table->sh_link];
  const uint64_t limit = uint64_t(1) << 30;  // a symbol table past 1 GiB is not a file we should read
  if (table->sh_size > limit || strs.sh_size > limit) return false;
  std::vector<Elf64_Sym> raw(table->sh_size / sizeof(Elf64_Sym));
  strtab_.resize(strs.sh_size);
  if (!read_at(f.fd, raw.data(), raw.size() * sizeof(Elf64_Sym), table->sh_offset) ||
      !read_at(f.fd, strtab_.data(), strtab_.size(), strs.sh_offset)) {
    strtab_.clear();
    return false;
  }
  for (const auto& s : raw) {
    const int type = ELF64_ST_TYPE(s.st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF || s.st_value == 0 || s.st_size == 0 ||
        s.st_name >= strtab_.size())
      continue;
    syms_.push_back({s.st_value, s.st_size, s.st_name, ELF64_ST_BIND(s.st_info) != STB_LOCAL});
  }
  // At one address, the global names last (find() takes the last start at or below the address);
  // otherwise the file's order.
  std::stable_sort(syms_.begin(), syms_.end(),
                   [](const Sym& a, const Sym& b) { return a.start != b.start ? a.start < b.start : a.global < b.global; });
  return !syms_.empty();
}

const char* ElfSymbols::find(uint64_t addr) const {
  auto it = std::upper_bound(syms_.begin(), syms_.end(), addr, [](uint64_t a, const Sym& s) { return a < s.start; });
  // Functions may nest (aliases, a cold part inside a larger range): the nearest start below that
  // still covers the address; a few steps back at most.
  for (int back = 0; it != syms_.begin() && back < 8; ++back) {
    --it;
    if (addr < it->start + it->size) return strtab_.c_str() + it->name;
  }
  return nullptr;
}

void LoadedModules::snapshot() {
  modules_.clear();
  segments_.clear();
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
  struct Ctx {
    LoadedModules* self;
    uint64_t page;
  } ctx{this, page};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto& c = *static_cast<Ctx*>(arg);
        Module m;
        m.name = info->dlpi_name ? info->dlpi_name : "";
        bool any = false;
        uint64_t first = 0;
        const size_t index = c.self->modules_.size();
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& p = info->dlpi_phdr[i];
          if (p.p_type != PT_LOAD || p.p_memsz == 0) continue;
          const uint64_t lo = uint64_t(info->dlpi_addr) + p.p_vaddr;
          c.self->segments_.push_back({lo, lo + p.p_memsz, index});
          if (!any || p.p_vaddr < first) first = p.p_vaddr, any = true;
        }
        if (!any) return 0;
        // The loader maps an object from its first PT_LOAD's page: that is its dli_fbase.
        m.base = uint64_t(info->dlpi_addr) + (first & ~(c.page - 1));
        c.self->modules_.push_back(std::move(m));
        return 0;
      },
      &ctx);
  std::sort(segments_.begin(), segments_.end(), [](const Segment& a, const Segment& b) { return a.lo < b.lo; });
}

const LoadedModules::Module* LoadedModules::find(uint64_t addr) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), addr,
                             [](uint64_t a, const Segment& s) { return a < s.lo; });
  if (it == segments_.begin()) return nullptr;
  --it;
  return addr < it->hi ? &modules_[it->module] : nullptr;
}

}  // namespace zt::probe
