// What a server's accept handler does with a failed accept.
#ifndef PSWITCH_PROTO_ACCEPT_RETRY_H_
#define PSWITCH_PROTO_ACCEPT_RETRY_H_

#include <chrono>
#include <functional>
#include <memory>

#include "asio.hpp"
#include "base/log.h"

namespace pswitch::proto {

// A closed acceptor (the server stopping) stays stopped. Any other failure is transient (out of
// fds, a peer gone before it was accepted): `accept` is called again in 100 ms, so a server never
// stops accepting for good. Runs on the acceptor's executor, like the handler that calls it.
template <typename Acceptor>
void AcceptAgainLater(Acceptor& acceptor, const asio::error_code& ec, const char* server,
                      std::function<void()> accept) {
  if (!acceptor.is_open() || ec == asio::error::operation_aborted) return;
  base::Log(base::LogLevel::kError, "accept_failed").Field("server", server).Field("error",
                                                                               ec.message());
  auto timer = std::make_shared<asio::steady_timer>(acceptor.get_executor(),
                                                    std::chrono::milliseconds(100));
  timer->async_wait([&acceptor, timer, accept = std::move(accept)](const asio::error_code&) {
    if (acceptor.is_open()) accept();
  });
}

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_ACCEPT_RETRY_H_
