// Public surface of the pure routing core, shared by the Worker, the coordinator and the simulator.
export * from './blocks.js';
export * from './fair-queue.js';
export * from './hash.js';
export * from './keys.js';
export * from './prefix-index.js';
export * from './random.js';
export * from './ring.js';
export * from './strategies/index.js';
export * from './types.js';
