// Uses the installed headers and libraries the way a user's program would: tensor
// math, an autograd step through an nn layer, and the Trainer's types.
#include <iostream>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "trainer/trainer.h"

int main() {
  using namespace ringtrain;
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = matmul(a, a.t());  // [[14, 32], [32, 77]]
  if (b.to_vector<float>() != std::vector<float>{14, 32, 32, 77}) {
    std::cerr << "consumer: wrong result " << b << "\n";
    return 1;
  }
  Generator gen(0);
  nn::Linear layer(3, 1, true, gen);
  autograd::backward(ag::sum(layer.forward(a)));
  if (!autograd::grad(layer.weight()).defined()) {
    std::cerr << "consumer: no gradient\n";
    return 1;
  }
  trainer::TrainerOptions options;  // the Trainer's header and library link
  trainer::Trainer trainer(options);
  std::cout << "consumer: ok\n";
  return 0;
}
