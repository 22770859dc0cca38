// Status helpers shared by every specnode module.
//
// SPECNODE_RETURN_IF_ERROR(expr)      returns expr's status from the caller when not OK.
// SPECNODE_ASSIGN_OR_RETURN(lhs, expr) evaluates a StatusOr, returns its status on error,
//                                     otherwise moves the value into lhs (may declare it).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPECNODE_STATUS_CONCAT_INNER(a, b) a##b
#define SPECNODE_STATUS_CONCAT(a, b) SPECNODE_STATUS_CONCAT_INNER(a, b)

#define SPECNODE_RETURN_IF_ERROR(expr)               \
  do {                                               \
    ::absl::Status specnode_status_ = (expr);        \
    if (!specnode_status_.ok()) return specnode_status_; \
  } while (0)

#define SPECNODE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

#define SPECNODE_ASSIGN_OR_RETURN(lhs, expr) \
  SPECNODE_ASSIGN_OR_RETURN_IMPL(SPECNODE_STATUS_CONCAT(specnode_statusor_, __LINE__), lhs, expr)
