// QueueEvents, FlowProducer and a default Worker (which subscribes to events by itself).
import { FlowProducer, Queue, QueueEvents, Worker } from "bunqueue/client";
import { connection, queueName, report, until } from "./_common";

const name = queueName("evflow");
const events = new QueueEvents(name, { connection });
const eventErrors: string[] = [];
events.on("error", (err) => eventErrors.push(String(err)));
await events.waitUntilReady();
const completedEvents: string[] = [];
events.on("completed", (e) => completedEvents.push(e.jobId));

const workerErrors: string[] = [];
const processed: string[] = [];
const worker = new Worker(name, async (j) => { processed.push(j.name); return j.name; }, { connection });
worker.on("error", (err) => workerErrors.push(String(err)));

const queue = new Queue(name, { connection });
const single = await queue.add("single", {});
const flow = new FlowProducer({ connection });
const tree = await flow.add({
  name: "parent",
  queueName: name,
  data: {},
  children: [
    { name: "child-a", queueName: name, data: {} },
    { name: "child-b", queueName: name, data: {} },
  ],
});
const done = await until(() => processed.includes("parent") && completedEvents.includes(single.id), 20_000);
const parentState = await queue.getJobState(tree.job.id);
await worker.close();
await events.close();
await flow.close();
report({ done, processed, completedEvents: completedEvents.length, parentState, eventErrors, workerErrors });
