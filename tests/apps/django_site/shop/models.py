from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    placed_at = models.DateTimeField(auto_now_add=True)


class Receipt(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    sent_at = models.DateTimeField(auto_now_add=True)
