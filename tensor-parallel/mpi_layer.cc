#include "tensor-parallel/mpi_layer.h"

#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// OpenMPI keeps the component it selected for each framework in a global of its component
// type; its headers (libopenmpi-dev ships them) give the layout. Other MPI libraries have
// no PML: the layer is then described by the library version alone.
#if defined(OPEN_MPI) && __has_include("opal/mca/mca.h")
#include "opal/mca/mca.h"
#define SPECNODE_OPENMPI_COMPONENTS 1
#endif

namespace specnode {
namespace {

#ifdef SPECNODE_OPENMPI_COMPONENTS
// libmpi's `mca_pml_base_selected_component` (a component) and
// `ompi_mtl_base_selected_component` (a pointer to one, null unless pml cm chose an MTL),
// looked up at run time so that nothing here links against OpenMPI's internals.
std::string SelectedPml() {
  const auto* c = static_cast<const mca_base_component_t*>(
      dlsym(RTLD_DEFAULT, "mca_pml_base_selected_component"));
  return c != nullptr ? std::string(c->mca_component_name) : "";
}

std::string SelectedMtl() {
  const auto* slot = static_cast<const mca_base_component_t* const*>(
      dlsym(RTLD_DEFAULT, "ompi_mtl_base_selected_component"));
  return slot != nullptr && *slot != nullptr ? std::string((*slot)->mca_component_name) : "";
}
#else
std::string SelectedPml() { return ""; }
std::string SelectedMtl() { return ""; }
#endif

std::string LibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "";
  // OpenMPI counts the terminating NUL in `len`: stop at the first NUL as well.
  const size_t n =
      strnlen(text, static_cast<size_t>(std::clamp(len, 0, MPI_MAX_LIBRARY_VERSION_STRING)));
  std::string s(text, n);
  return s.substr(0, s.find_first_of("\r\n"));
}

std::vector<std::string> RdmaDevices() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string MpiLayer::Describe() const {
  std::string s = pml.empty() ? "the MPI library's point-to-point layer" : "pml " + pml;
  if (!mtl.empty()) absl::StrAppend(&s, " (mtl ", mtl, ")");
  if (!rdma_devices.empty()) {
    absl::StrAppend(&s, ", RDMA devices: ", absl::StrJoin(rdma_devices, ", "));
  }
  return s;
}

MpiLayer CurrentMpiLayer() {
  MpiLayer layer;
  layer.library = LibraryVersion();
  layer.pml = SelectedPml();
  if (layer.pml == "cm") layer.mtl = SelectedMtl();
  layer.rdma_devices = RdmaDevices();
  return layer;
}

}  // namespace specnode
