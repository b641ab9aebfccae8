// The fake driver's graphs and graph executables: graphs with event-record, event-wait,
// child-graph, kernel and empty nodes (a capture's graph has none the fake keeps), the node
// queries, instantiation, and an executable's launch, update, edits and destruction. A launched
// executable records its graph's event-record nodes (child graphs included) on the launch stream's
// timeline, as the real driver does, so later waits on those events are ordered by the fake like
// any other. Handles of graphs the fake did not make, or destroyed, are refused
// (CUDA_ERROR_INVALID_VALUE), as are executables it did not make or destroyed
// (CUDA_ERROR_INVALID_HANDLE) and edits naming a node not of the executable's graph.
#include <cstring>

#include "fake_cuda_state.h"

using namespace fake_cuda_impl;

namespace {

CUresult add_node(const char* name, CUgraphNode* out, CUgraph g, CUgraphNodeType type, uint64_t event,
                  uint64_t child, uint64_t function = 0) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = reinterpret_cast<uint64_t>(g);
  c.event = event;
  auto it = s.graphs.find(c.value);
  if (out == nullptr || it == s.graphs.end()) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if (child != 0 && s.graphs.count(child) == 0) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if (event != 0 && s.events.count(event) == 0) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  const uint64_t node = s.next_handle += 0x100;
  if (function != 0 && s.functions.count(function) == 0) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  s.graph_nodes[node] = {type, event, child, function};
  it->second.push_back(node);
  *out = reinterpret_cast<CUgraphNode>(node);
  return finish(s, c);
}

// The node's record under s.mu, or null for an unknown handle.
const GraphNode* node_of(State& s, CUgraphNode n) {
  auto it = s.graph_nodes.find(reinterpret_cast<uint64_t>(n));
  return it == s.graph_nodes.end() ? nullptr : &it->second;
}

// The nodes of `graph` and of their child graphs, depth first (under s.mu).
void flatten(const State& s, uint64_t graph, int depth, GraphExec& out) {
  auto it = s.graphs.find(graph);
  if (it == s.graphs.end() || depth > 8) return;
  for (uint64_t n : it->second) {
    const GraphNode& node = s.graph_nodes.at(n);
    out.nodes.push_back(n);
    out.now.push_back(node);
    if (node.type == CU_GRAPH_NODE_TYPE_GRAPH) flatten(s, node.child, depth + 1, out);
  }
}

// `upload_stream`: the stream an instantiate with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD uploads into
// (logged as the call's stream; 0 without).
CUresult instantiate(const char* name, CUgraphExec* exec, CUgraph g, CUstream upload_stream = nullptr) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = reinterpret_cast<uint64_t>(g);
  c.stream = reinterpret_cast<uint64_t>(upload_stream);
  if (exec == nullptr || s.graphs.count(c.value) == 0) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  GraphExec made;
  flatten(s, c.value, 0, made);
  CUresult rc = finish(s, c);
  if (rc == CUDA_SUCCESS) {
    const uint64_t handle = s.next_handle += 0x100;
    s.graph_execs[handle] = std::move(made);
    *exec = reinterpret_cast<CUgraphExec>(handle);
  }
  return rc;
}

}  // namespace

namespace fake_cuda_impl {
void record_graph_events(State& s, uint64_t exec, uint64_t stream_id) {
  auto it = s.graph_execs.find(exec);
  if (it == s.graph_execs.end()) return;
  for (const GraphNode& node : it->second.now) {
    if (node.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) record_event_now(s, node.event, stream_id);
  }
}
CUresult check_graph_exec(const State& s, uint64_t exec) {
  return s.graph_execs.count(exec) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
}  // namespace fake_cuda_impl

FAKE_EXPORT CUresult CUDAAPI cuGraphCreate(CUgraph* g, unsigned int) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGraphCreate");
  if (g == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  c.value = s.next_handle += 0x100;
  s.graphs[c.value] = {};
  *g = reinterpret_cast<CUgraph>(c.value);
  return finish(s, c);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph g) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGraphDestroy");
  c.value = reinterpret_cast<uint64_t>(g);
  // Executables keep what they were made from (the real driver copies the graph).
  return finish(s, c, s.graphs.erase(c.value) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t) {
  return add_node("cuGraphAddEmptyNode", n, g, CU_GRAPH_NODE_TYPE_EMPTY, 0, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                                       CUevent e) {
  return add_node("cuGraphAddEventRecordNode", n, g, CU_GRAPH_NODE_TYPE_EVENT_RECORD, reinterpret_cast<uint64_t>(e), 0);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                                     CUevent e) {
  return add_node("cuGraphAddEventWaitNode", n, g, CU_GRAPH_NODE_TYPE_WAIT_EVENT, reinterpret_cast<uint64_t>(e), 0);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphAddExternalSemaphoresSignalNode(CUgraphNode* n, CUgraph g, const CUgraphNode*,
                                                                    size_t, const CUDA_EXT_SEM_SIGNAL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return add_node("cuGraphAddExternalSemaphoresSignalNode", n, g, CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL, 0, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                                      CUgraph child) {
  return add_node("cuGraphAddChildGraphNode", n, g, CU_GRAPH_NODE_TYPE_GRAPH, 0, reinterpret_cast<uint64_t>(child));
}
FAKE_EXPORT CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                                    const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t f = p->func != nullptr ? reinterpret_cast<uint64_t>(p->func) : reinterpret_cast<uint64_t>(p->kern);
  return add_node("cuGraphAddKernelNode_v2", n, g, CU_GRAPH_NODE_TYPE_KERNEL, 0, 0, f);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS* p) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGraphKernelNodeGetParams_v2");
  const GraphNode* node = node_of(s, n);
  if (node == nullptr || node->type != CU_GRAPH_NODE_TYPE_KERNEL || p == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  *p = CUDA_KERNEL_NODE_PARAMS{};
  auto fn = s.functions.find(node->function);
  if (fn != s.functions.end() && fn->second->is_kernel) {
    p->kern = reinterpret_cast<CUkernel>(node->function);
  } else {
    p->func = reinterpret_cast<CUfunction>(node->function);
  }
  return finish(s, c);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGraphGetNodes");
  c.value = reinterpret_cast<uint64_t>(g);
  if (count == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  auto it = s.graphs.find(c.value);
  static const std::vector<uint64_t> kNone;  // a captured graph: no nodes the fake keeps
  const std::vector<uint64_t>& all = it == s.graphs.end() ? kNone : it->second;
  if (nodes != nullptr) {
    for (size_t i = 0; i < *count && i < all.size(); ++i) nodes[i] = reinterpret_cast<CUgraphNode>(all[i]);
  }
  *count = all.size();
  return finish(s, c);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType* type) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGraphNodeGetType");
  const GraphNode* node = node_of(s, n);
  if (node == nullptr || type == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  *type = node->type;
  return finish(s, c);
}
namespace {
CUresult node_event(const char* name, CUgraphNode n, CUgraphNodeType want, CUevent* out) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  const GraphNode* node = node_of(s, n);
  if (node == nullptr || node->type != want || out == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  c.event = node->event;
  *out = reinterpret_cast<CUevent>(node->event);
  return finish(s, c);
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode n, CUevent* e) {
  return node_event("cuGraphEventRecordNodeGetEvent", n, CU_GRAPH_NODE_TYPE_EVENT_RECORD, e);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode n, CUevent* e) {
  return node_event("cuGraphEventWaitNodeGetEvent", n, CU_GRAPH_NODE_TYPE_WAIT_EVENT, e);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph* g) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGraphChildGraphNodeGetGraph");
  const GraphNode* node = node_of(s, n);
  if (node == nullptr || node->type != CU_GRAPH_NODE_TYPE_GRAPH || g == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  *g = reinterpret_cast<CUgraph>(node->child);
  return finish(s, c);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph g, unsigned long long) {
  return instantiate("cuGraphInstantiateWithFlags", exec, g);
}
// The pre-12.0 ABIs (an error node and a log buffer instead of flags).
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph g, CUgraphNode*, char*, size_t) {
  return instantiate("cuGraphInstantiate", exec, g);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph g, CUgraphNode*, char*, size_t) {
  return instantiate("cuGraphInstantiate_v2", exec, g);
}
namespace {
CUstream upload_stream_of(const CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return p != nullptr && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0 ? p->hUploadStream : nullptr;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return instantiate("cuGraphInstantiateWithParams", exec, g, upload_stream_of(p));
}
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph g,
                                                               CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return instantiate("cuGraphInstantiateWithParams_ptsz", exec, g, upload_stream_of(p));
}

// ---------------- Executables: launch, destroy, update, edits ----------------
// Each needs a live executable (one the fake made and did not destroy): CUDA_ERROR_INVALID_HANDLE
// otherwise, where the real driver's behaviour is undefined (a freed object's address).
namespace {
CUresult graph_launch(const char* name, CUgraphExec g, CUstream s) {
  {
    State& state = st();
    std::lock_guard lock(state.mu);
    if (CUresult rc = check_graph_exec(state, reinterpret_cast<uint64_t>(g)); rc != CUDA_SUCCESS) {
      fake_cuda_call& c = begin(state, name);
      c.stream = reinterpret_cast<uint64_t>(s);
      c.value = reinterpret_cast<uint64_t>(g);
      return finish(state, c, rc);
    }
  }
  bool captured = false;
  const CUresult rc = simple(name, s, reinterpret_cast<uint64_t>(g), 100, false, &captured);
  if (rc == CUDA_SUCCESS && !captured) {
    // Its event-record nodes record their events where the launch sits in the stream.
    State& state = st();
    std::lock_guard lock(state.mu);
    record_graph_events(state, reinterpret_cast<uint64_t>(g), sid(s, std::strstr(name, "_pt") != nullptr));
  }
  return rc;
}

// What an executable's call does beyond checking it: `node` (an edit's node) goes to the call's
// params, so a log reader can tell edits apart.
enum class ExecChange { kDestroy, kUpdate, kEditNode, kEditKernelNode };

CUresult graph_exec_op(const char* name, CUgraphExec g, ExecChange change, CUgraphNode node = nullptr,
                       CUgraph update_from = nullptr) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = reinterpret_cast<uint64_t>(g);
  c.param_bytes = fake_cuda_pack_args(c.params, sizeof c.params, node);
  if (CUresult rc = check_graph_exec(s, c.value); rc != CUDA_SUCCESS) return finish(s, c, rc);
  GraphExec& exec = s.graph_execs.at(c.value);
  GraphExec updated;
  size_t at = 0;  // an edit's node in the executable
  switch (change) {
    case ExecChange::kDestroy:
      break;
    case ExecChange::kUpdate:
      // Only parameters may change: the same nodes of the same types, in the same order.
      if (s.graphs.count(reinterpret_cast<uint64_t>(update_from)) == 0) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
      flatten(s, reinterpret_cast<uint64_t>(update_from), 0, updated);
      if (updated.now.size() != exec.now.size()) return finish(s, c, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
      for (size_t i = 0; i < updated.now.size(); ++i) {
        if (updated.now[i].type != exec.now[i].type) return finish(s, c, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
      }
      break;
    case ExecChange::kEditNode:
    case ExecChange::kEditKernelNode:
      // The node must come from the graph the executable was instantiated from.
      while (at < exec.nodes.size() && exec.nodes[at] != reinterpret_cast<uint64_t>(node)) ++at;
      if (at == exec.nodes.size()) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
      if (change == ExecChange::kEditKernelNode && exec.now[at].type != CU_GRAPH_NODE_TYPE_KERNEL) {
        return finish(s, c, CUDA_ERROR_INVALID_VALUE);
      }
      break;
  }
  CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  if (change == ExecChange::kDestroy) s.graph_execs.erase(c.value);
  if (change == ExecChange::kUpdate) exec.now = std::move(updated.now);
  return rc;
}
}  // namespace

FAKE_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec g, CUstream s) {
  return graph_launch("cuGraphLaunch", g, s);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
  return graph_launch("cuGraphLaunch_ptsz", g, s);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec g) {
  return graph_exec_op("cuGraphExecDestroy", g, ExecChange::kDestroy);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec g, CUgraph graph, CUgraphExecUpdateResultInfo*) {
  return graph_exec_op("cuGraphExecUpdate_v2", g, ExecChange::kUpdate, nullptr, graph);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec g, CUgraph graph, CUgraphNode*, CUgraphExecUpdateResult*) {
  return graph_exec_op("cuGraphExecUpdate", g, ExecChange::kUpdate, nullptr, graph);
}
// Edits of an executable: launches that reach the driver afterwards run the edited executable.
FAKE_EXPORT CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec g, CUgraphNode n,
                                                               const CUDA_KERNEL_NODE_PARAMS*) {
  return graph_exec_op("cuGraphExecKernelNodeSetParams_v2", g, ExecChange::kEditKernelNode, n);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec g, CUgraphNode n, CUgraphNodeParams*) {
  return graph_exec_op("cuGraphExecNodeSetParams", g, ExecChange::kEditNode, n);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec g, CUgraphNode n, unsigned int) {
  return graph_exec_op("cuGraphNodeSetEnabled", g, ExecChange::kEditNode, n);
}
