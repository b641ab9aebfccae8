// The fake driver's explicit graph API, enough for the shim's graph inspection: graphs with
// event-record, event-wait, child-graph and empty nodes, the node queries, and instantiation. A
// launched executable records its graph's event-record nodes (child graphs included) on the
// launch stream's timeline, as the real driver does, so later waits on those events are ordered
// by the fake like any other. Handles of destroyed graphs are refused (CUDA_ERROR_INVALID_VALUE).
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

CUresult instantiate(const char* name, CUgraphExec* exec, CUgraph g) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = reinterpret_cast<uint64_t>(g);
  if (exec == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  // A graph a capture made is not in s.graphs: it instantiates as a graph without nodes.
  const uint64_t handle = s.next_handle += 0x100;
  s.exec_graph[handle] = c.value;
  CUresult rc = finish(s, c);
  if (rc == CUDA_SUCCESS) *exec = reinterpret_cast<CUgraphExec>(handle);
  return rc;
}

void record_nodes(State& s, uint64_t graph, uint64_t stream_id, int depth) {
  auto it = s.graphs.find(graph);
  if (it == s.graphs.end() || depth > 8) return;
  for (uint64_t n : it->second) {
    const GraphNode& node = s.graph_nodes[n];
    if (node.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) record_event_now(s, node.event, stream_id);
    if (node.type == CU_GRAPH_NODE_TYPE_GRAPH) record_nodes(s, node.child, stream_id, depth + 1);
  }
}

}  // namespace

namespace fake_cuda_impl {
void record_graph_events(State& s, uint64_t exec, uint64_t stream_id) {
  auto it = s.exec_graph.find(exec);
  if (it != s.exec_graph.end()) record_nodes(s, it->second, stream_id, 0);
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
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS*) {
  return instantiate("cuGraphInstantiateWithParams", exec, g);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph g,
                                                               CUDA_GRAPH_INSTANTIATE_PARAMS*) {
  return instantiate("cuGraphInstantiateWithParams_ptsz", exec, g);
}
